"""A job survives what a real fleet does to it (issue: lifecycle under failure)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from fairgang.dev import temporal_binary
from tests.e2e.conftest import REPO, TERMINAL, Platform, job_spec

pytestmark = pytest.mark.e2e


def training_spec(name: str, steps: int = 120, every: int = 10, step_s: float = 0.05, **extra: Any) -> dict[str, Any]:
    spec = job_spec(name, "", **extra)
    spec["entrypoint"] = [sys.executable, str(REPO / "examples" / "train_numpy.py"), "--steps", str(steps),
                          "--checkpoint-every", str(every), "--step-seconds", str(step_s)]  # fmt: skip
    return spec


def log_of(platform: Platform, job_id: str, attempt: int, rank: int = 0) -> str:
    with platform.client("admin-token") as http:
        return http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": attempt, "rank": rank}).text


def wait_for_checkpoint(platform: Platform, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = platform.job(job_id)
        if job["latest_checkpoint"]:
            return job
        assert job["state"] not in TERMINAL, job
        time.sleep(0.2)
    raise AssertionError(f"no checkpoint reported for {job_id}\n{platform.logs()}")


def resumed_step(log: str) -> int:
    match = re.search(r"resumed from step (\d+)", log)
    assert match, log[-2000:]
    return int(match.group(1))


def attempt_intervals(platform: Platform, job_id: str) -> list[tuple[float, float]]:
    """(first write, last write) of each attempt's log that exists, in attempt order."""
    paths = sorted((platform.data_dir / "logs" / job_id).glob("attempt-*-rank-0.log"), key=lambda p: int(p.name.split("-")[1]))
    return [(p.stat().st_ctime, p.stat().st_mtime) for p in paths]


def test_preempt_checkpoints_and_the_next_attempt_resumes_from_it(platform: Platform) -> None:
    job = platform.submit(training_spec("preempt-me", steps=150))
    wait_for_checkpoint(platform, job["id"])
    with platform.client("alpha-token") as http:
        answer = http.post(f"/v1/jobs/{job['id']}/preempt")
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"]
    done = platform.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED", done
    assert done["attempt"] == 2
    first, second = log_of(platform, job["id"], 1), log_of(platform, job["id"], 2)
    stopped_at = int(re.search(r"SIGTERM: checkpointed step (\d+)", first).group(1))  # type: ignore[union-attr]
    assert resumed_step(second) == stopped_at > 0
    assert "finished 150 steps" in second
    kinds = [e["kind"] for e in done["events"]]
    assert kinds.index("PREEMPTING") < kinds.index("REQUEUED") < kinds.index("SUCCEEDED")
    assert done["latest_checkpoint"].endswith(".npz")


def test_preempt_from_the_temporal_cli_and_refusal_when_not_running(platform: Platform) -> None:
    job = platform.submit(training_spec("preempt-cli", steps=150))
    wait_for_checkpoint(platform, job["id"])
    cli = [temporal_binary(), "workflow", "update", "execute", "--address", platform.temporal_address, "--workflow-id", job["id"]]
    out = subprocess.run(
        [*cli, "--name", "preempt", "--input", '{"reason": "from the temporal cli"}'], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    done = platform.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2
    assert any(e["kind"] == "PREEMPTING" and "from the temporal cli" in e["message"] for e in done["events"])
    with platform.client("alpha-token") as http:
        refused = http.post(f"/v1/jobs/{job['id']}/preempt")
    assert refused.status_code == 409 and "SUCCEEDED" in refused.text


def test_gang_member_failure_stops_the_other_member(platform: Platform, tmp_path: Path) -> None:
    pid_file = tmp_path / "rank0.pid"
    code = (
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n    time.sleep(2); sys.exit(5)\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    job = platform.submit(job_spec("gang-fail", code, gpu_count=16, grace_period="2s"))
    done = platform.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "FAILED" and done["exit_code"] == 5, done
    assert "member 1 exited with code 5" in done["end_reason"]
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"


def test_own_failures_retry_as_the_spec_says_then_succeed(platform: Platform) -> None:
    code = "import os, sys; sys.exit(0 if os.environ['FAIRGANG_ATTEMPT'] == '2' else 9)"
    done = platform.wait_for(platform.submit(job_spec("retry-once", code, retries=1))["id"], TERMINAL)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2
    assert any(e["kind"] == "REQUEUED" and "exited with code 9" in e["message"] for e in done["events"])


def test_max_runtime_stops_the_job_gracefully_and_ends_timed_out(platform: Platform) -> None:
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('stopping on SIGTERM', flush=True), sys.exit(0)))\n"
        "time.sleep(600)\n"
    )
    job = platform.submit(job_spec("too-long", code, max_runtime="3s"))
    done = platform.wait_for(job["id"], TERMINAL, timeout=60)
    assert done["state"] == "TIMED_OUT", done
    assert done["end_reason"] == "max runtime reached"
    assert "stopping on SIGTERM" in log_of(platform, job["id"], 1)


def _kill_part(platform: Platform, name: str) -> int:
    pids = json.loads((platform.data_dir / "pids.json").read_text())
    os.kill(pids[name], signal.SIGKILL)
    return int(pids[name])


def test_node_loss_requeues_and_resumes_on_another_node(platform: Platform) -> None:
    job = platform.submit(training_spec("survives-node-loss", steps=200, every=10))
    running = wait_for_checkpoint(platform, job["id"])
    lost_node = running["allocation"]["members"][0]["node_id"]
    hold = platform.data_dir / "hold" / f"agent-{lost_node}"
    hold.parent.mkdir(exist_ok=True)
    hold.touch()
    try:
        _kill_part(platform, f"agent-{lost_node}")
        done = platform.wait_for(job["id"], TERMINAL, timeout=150)
        assert done["state"] == "SUCCEEDED", done
        assert done["attempt"] >= 2
        assert lost_node not in [m["node_id"] for m in done["allocation"]["members"]]
        assert resumed_step(log_of(platform, job["id"], done["attempt"])) > 0
        assert any(e["kind"] == "REQUEUED" and "lost" in e["message"] for e in done["events"])
        with platform.client("admin-token") as http:
            node = next(n for n in http.get("/v1/fleet").json()["nodes"] if n["id"] == lost_node)
        assert node["state"] == "LOST" and not node["schedulable"]
        intervals = attempt_intervals(platform, job["id"])
        assert len(intervals) >= 2
        for (_, earlier_end), (later_start, _) in itertools.pairwise(intervals):
            assert earlier_end <= later_start, "an attempt still wrote its log after the next one started"
    finally:
        hold.unlink()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with platform.client("admin-token") as http:
            node = next(n for n in http.get("/v1/fleet").json()["nodes"] if n["id"] == lost_node)
        if node["state"] == "READY" and node["schedulable"]:
            break
        time.sleep(0.5)
    assert node["state"] == "READY", "a restarted agent brings its node back"


@pytest.mark.parametrize("part", ["api", "scheduler", "worker", "agent", "temporal"])
def test_kill_9_of_one_part_loses_no_job(platform: Platform, part: str) -> None:
    running = platform.submit(training_spec(f"kill-{part}-running", steps=140, every=10, gpu_count=8))
    wait_for_checkpoint(platform, running["id"])
    node = platform.job(running["id"])["allocation"]["members"][0]["node_id"]
    queued = platform.submit(job_spec(f"kill-{part}-queued", "print('queued job ran')", gpu_count=8, topology={"level": "node"}))
    waiting = platform.submit(job_spec(f"kill-{part}-waiting", "print('waiting job ran')", gpu_count=16))
    _kill_part(platform, f"agent-{node}" if part == "agent" else part)
    for job in (running, queued, waiting):
        done = platform.wait_for(job["id"], TERMINAL, timeout=180)
        assert done["state"] == "SUCCEEDED", (part, done)
    if part == "agent":
        assert platform.job(running["id"])["attempt"] >= 2
        assert resumed_step(log_of(platform, running["id"], platform.job(running["id"])["attempt"])) > 0
