"""The live benchmark's harness at tiny scale: the real platform on SQLite, 8 simulated nodes, 20 s measured.

It checks that the harness measures something: jobs were placed, launched by the agent hosts, went
RUNNING and finished, and every row of the table has its figures. Speed is the benchmark's business
(benchmarks/live_bench.py at full scale), not this test's.
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import live_bench

ROWS_WITH_FIGURES = (
    "capacity freed -> binding committed",
    "capacity freed -> committed and signalled",
    "capacity freed -> RUNNING",
    "cycle (whole)",
    "heartbeat latency",
    "heartbeats answered",
    "submission latency",
    "submission rate (burst, 12 clients)",
    "view /v1/queue",
    "view /v1/tenants",
    "view /v1/fleet",
    "view /metrics",
    "control-plane peak RSS (largest)",
)


async def test_live_bench_smoke(tmp_path: Path) -> None:
    lines: list[str] = []
    opts = live_bench.Options(
        store="sqlite",
        nodes=8,
        duration=20.0,
        # Run times average 4 h / 1200 = 12 s: jobs start and end inside the window.
        speedup=1200.0,
        hosts=2,
        history_days=0.05,
        running=12,
        queued=6,
        burst=10,
        warmup_timeout=60.0,
        data_dir=tmp_path / "live",
        say=lines.append,
    )
    result = await live_bench.run(opts)
    table = live_bench.table(result)
    rows = {r.name: r for r in result.rows}
    for name in ROWS_WITH_FIGURES:
        assert name in rows, f"row {name!r} missing:\n{table}"
        assert rows[name].p99 is not None, f"row {name!r} has no figures:\n{table}"
    assert rows["capacity freed -> RUNNING"].n > 0, table
    beats = rows["heartbeat latency"]
    failed = int(re.search(r"(\d+) failed", beats.note).group(1))  # type: ignore[union-attr]
    # The agents' heartbeats get through (on a loaded machine one may time out now and then).
    assert beats.n > 0 and failed <= max(1, beats.n // 20), table
    assert result.counts["launched_by_agents"] > 0 and result.counts["exited_in_agents"] > 0, table
    assert result.counts["finished_in_window"] > 0 and result.counts.get("SUCCEEDED", 0) > 0, table
    assert result.counts["submitted"] > 10 and result.counts["submit_errors"] == 0, table
    assert {"api", "scheduler", "worker", "temporal", "agents-0", "agents-1"} <= set(result.processes), table
    assert all(p["cpu_s"] > 0 for n, p in result.processes.items() if n in ("api", "scheduler", "worker")), table
