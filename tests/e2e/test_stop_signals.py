"""Cancel and preempt reach the members through their agents' `stop` activity, on the whole platform.

The platform runs with an activity heartbeat timeout of 300 s: the agents' workers then send a launch's
heartbeats when it starts and every 60 s after (the SDK's largest throttle interval), so the launch's own
cancellation, which comes only with a heartbeat answer, cannot reach a member within the 30 s the test
waits after a request sent a few seconds after the start. The member ignores SIGTERM and records when it
came and when it was last alive: the SIGKILL must come no earlier than one grace period after it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Platform, job_spec, only
from worker_agent.launch import pid_alive

pytestmark = [pytest.mark.e2e, only("postgres")]

BOUND_S = 30.0
GRACE_S = 2.0
#: The member's records lag what they record when it is not scheduled at once (a loaded machine).
LAG_S = 0.5

MEMBER = r"""
import os, signal, sys, time
d = os.path.join(sys.argv[1], os.environ["FAIRGANG_ATTEMPT"])
os.makedirs(d, exist_ok=True)
def on_term(*_):
    with open(d + "/term", "a") as f:
        f.write(f"{time.time():.6f}\n")
signal.signal(signal.SIGTERM, on_term)
open(d + "/pid", "w").write(str(os.getpid()))
while True:
    with open(d + "/alive", "a") as f:
        f.write(f"{time.time():.6f}\n")
    time.sleep(0.02)
"""


@pytest.fixture(scope="module")
def platform(platform_factory: Any) -> Platform:
    p: Platform = platform_factory()
    p.extra_env["FAIRGANG_ACTIVITY_HEARTBEAT_TIMEOUT_S"] = "300"
    p.start()
    return p


def times(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def running_member(platform: Platform, tmp_path: Path, name: str) -> tuple[str, Path]:
    spec = job_spec(name, "", grace_period=f"{GRACE_S:g}s")
    spec["entrypoint"] = [spec["entrypoint"][0], "-c", MEMBER, str(tmp_path)]
    job = platform.submit(spec)
    platform.wait_for(job["id"], {"RUNNING"}, timeout=60)
    d = tmp_path / "1"
    deadline = time.monotonic() + 60
    while not times(d / "alive"):
        assert time.monotonic() < deadline, "the member never started"
        time.sleep(0.05)
    return job["id"], d


def assert_stopped_after_a_whole_grace(d: Path) -> float:
    [term] = times(d / "term")
    assert max(times(d / "alive")) >= term + GRACE_S - LAG_S, "SIGKILLed before the grace period after the SIGTERM ran out"
    pid, deadline = int((d / "pid").read_text()), time.monotonic() + 30
    while pid_alive(pid):  # SIGKILLed; gone once it has been reaped
        assert time.monotonic() < deadline, "the member still runs"
        time.sleep(0.02)
    return term


def test_cancel_reaches_the_member_without_a_heartbeat(platform: Platform, tmp_path: Path) -> None:
    job_id, d = running_member(platform, tmp_path, "cancel-fast")
    with platform.client("alpha-token") as http:
        assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    done = platform.wait_for(job_id, {"CANCELLED"}, timeout=BOUND_S)
    term = assert_stopped_after_a_whole_grace(d)
    ended = next(e for e in done["events"] if e["kind"] == "CANCELLED")
    assert ended["ts"] >= term + GRACE_S - LAG_S


def test_preempt_reaches_the_member_without_a_heartbeat(platform: Platform, tmp_path: Path) -> None:
    job_id, d = running_member(platform, tmp_path, "preempt-fast")
    with platform.client("alpha-token") as http:
        answer = http.post(f"/v1/jobs/{job_id}/preempt")
    assert answer.status_code == 200 and answer.json()["accepted"], answer.text
    deadline = time.monotonic() + BOUND_S
    while True:
        job = platform.job(job_id)
        if any(e["kind"] == "REQUEUED" for e in job["events"]):
            break
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    term = assert_stopped_after_a_whole_grace(d)
    requeued = next(e for e in job["events"] if e["kind"] == "REQUEUED")
    assert requeued["ts"] >= term + GRACE_S - LAG_S
    with platform.client("alpha-token") as http:
        assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    platform.wait_for(job_id, {"CANCELLED"}, timeout=60)
