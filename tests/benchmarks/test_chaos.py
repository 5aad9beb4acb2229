"""The chaos run (benchmarks/chaos.py): its audit finds what it looks for, and a 2-minute run of the whole
platform under faults ends with every invariant held and every fault recovered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks import chaos

REPO = Path(__file__).resolve().parents[2]


def test_a_gpu_held_by_two_allocations_at_once_is_found() -> None:
    gpus: list[dict[str, Any]] = [{"node_id": "h1", "gpu_indices": [0, 1], "rank": 0}]
    one_after_another = [("a-1", 10.0, 20.0, gpus), ("a-2", 20.0, 30.0, gpus), ("a-3", 31.0, None, gpus)]
    assert chaos.gpu_double_bookings(one_after_another) == []
    # a-2 starts before a-1 is released; a-4 starts inside a long a-3 that a shorter a-3b follows.
    overlapping = [("a-1", 10.0, 20.0, gpus), ("a-2", 19.0, 30.0, [{"node_id": "h1", "gpu_indices": [1], "rank": 0}])]
    assert chaos.gpu_double_bookings(overlapping) == ["h1 GPU 1: a-1 and a-2"]
    elsewhere: list[dict[str, Any]] = [{"node_id": "h2", "gpu_indices": [0]}]
    enclosed: list[tuple[str, float, float | None, list[dict[str, Any]]]] = [
        ("a-3", 0.0, 100.0, gpus[:1]),
        ("a-3b", 100.0, 101.0, elsewhere),
        ("a-4", 50.0, 60.0, gpus),
    ]
    assert chaos.gpu_double_bookings(enclosed) == ["h1 GPU 0: a-3 and a-4", "h1 GPU 1: a-3 and a-4"]
    never_released = [("a-5", 0.0, None, gpus), ("a-6", 1000.0, 1001.0, gpus)]
    assert len(chaos.gpu_double_bookings(never_released)) == 2


def test_attempts_alive_at_once_and_resumes_going_back_are_found() -> None:
    clean = "resume 1 0 0\nalive 1 0 10.0\nalive 1 1 10.5\nalive 1 0 11.0\nresume 2 0 20\nalive 2 0 12.0\nalive 2 1 12.5\n"
    assert chaos.attempt_violations("j", clean) == ([], [])
    overlap = "alive 1 0 10.0\nalive 1 1 13.0\nalive 2 0 12.0\nalive 3 0 12.5\n"
    overlaps, _ = chaos.attempt_violations("j", overlap)
    assert len(overlaps) == 2 and "attempt 1 alive until 13.000, attempt 2 from 12.000" in overlaps[0]
    back = "resume 1 0 0\nresume 2 0 30\nresume 2 1 0\nresume 3 0 20\n"
    assert chaos.attempt_violations("j", back) == ([], ["j: its attempts resumed from steps [0, 30, 20]"])


def test_checkpoints_recorded_out_of_order_are_found() -> None:
    rows = [("j-1", "/c/step-00000010.npz"), ("j-2", "/c/step-00000010.npz"), ("j-1", "/c/step-00000020.npz")]
    assert chaos.checkpoint_regressions(rows) == []
    rows += [("j-1", "/c/step-00000005.npz"), ("j-2", "/c/rank-1/step-00000001.npz")]
    assert chaos.checkpoint_regressions(rows) == ["j-1: recorded checkpoints at steps [10, 20, 5]"]


@pytest.mark.skipif(os.geteuid() != 0 or chaos.PG_BIN is None, reason="the chaos run's own PostgreSQL needs root and its binaries")
def test_a_two_minute_chaos_run_holds_every_invariant(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    cmd = [sys.executable, "-m", "benchmarks.chaos", "--minutes", "2", "--seed", "7", "--json", str(out), "--every", "4"]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert out.exists(), run.stdout[-3000:] + run.stderr[-6000:]
    report = json.loads(out.read_text())
    assert report["store"] == "postgres (own server)"
    assert len(report["faults"]) >= 4 and len({f["part"] for f in report["faults"]}) >= 4, report["faults"]
    assert all(f["recovery_s"] is not None for f in report["faults"]), (report["faults"], run.stderr[-6000:])
    assert {name: found for name, found in report["violations"].items() if found} == {}, run.stderr[-6000:]
    assert report["jobs"]["submitted"] >= 10 and report["jobs"]["succeeded"] == report["jobs"]["submitted"], report["jobs"]
    assert run.returncode == 0, run.stderr[-3000:]
