"""A job survives what a real fleet does to it."""

from __future__ import annotations

import asyncio
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
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from cli.platform import temporal_binary
from tests.e2e.conftest import REPO, RESTART_WITHIN_LEASE, TERMINAL, Platform, job_spec, only
from worker_agent.launch import pid_alive
from workflows.job import master_port

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


#: Runs a training script (argv[2:]) in this process while a thread appends "attempt rank wall-time" to the
#: file argv[1] every 50 ms, so the job itself records when each attempt and rank was alive. It also prints
#: the platform's rendezvous variables and writes its pid to argv[1].pid-<attempt>-<rank>. With IGNORE_TERM=
#: "attempt:rank" that member ignores SIGTERM (and keeps running after its steps) until it is SIGKILLed.
TIMED = r"""
import os, runpy, signal, sys, threading, time
out, attempt, rank = sys.argv[1], os.environ["FAIRGANG_ATTEMPT"], os.environ["RANK"]
keys = ("NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RESUME_FROM")
print("env", " ".join(f"{k}={os.environ[k]!r}" for k in keys), flush=True)
open(f"{out}.pid-{attempt}-{rank}", "w").write(str(os.getpid()))
if rank != "0":
    os.environ["CHECKPOINT_DIR"] += f"/rank-{rank}"
ignore = os.environ.get("IGNORE_TERM") == f"{attempt}:{rank}"
if ignore:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal = lambda *a: None
pause = os.environ.get("PAUSE_WHILE")
if pause:  # the training's steps wait while this file exists (a test holds a job at a point)
    _sleep = time.sleep
    def sleep(seconds):
        _sleep(seconds)
        while threading.current_thread() is threading.main_thread() and os.path.exists(pause):
            _sleep(0.05)
    time.sleep = sleep

def tick():
    with open(out, "a") as f:
        while True:
            f.write(f"{attempt} {rank} {time.time():.3f}\n")
            f.flush()
            time.sleep(0.05)

threading.Thread(target=tick, daemon=True).start()
sys.argv = sys.argv[2:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    while ignore:
        time.sleep(1)
"""


def timed_training_spec(name: str, ticks: Path, steps: int = 120, every: int = 10, **extra: Any) -> dict[str, Any]:
    """training_spec, run under TIMED: the job records in ``ticks`` when each attempt and rank was alive."""
    spec = training_spec(name, steps=steps, every=every, **extra)
    spec["entrypoint"] = [sys.executable, "-c", TIMED, str(ticks), *spec["entrypoint"][1:]]
    return spec


def attempt_spans(ticks: Path) -> dict[int, tuple[float, float]]:
    """attempt -> (first, last) wall time any of its members recorded itself alive."""
    spans: dict[int, tuple[float, float]] = {}
    for line in ticks.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3 or "." not in parts[2]:
            continue
        attempt, t = int(parts[0]), float(parts[2])
        first, last = spans.get(attempt, (t, t))
        spans[attempt] = (min(first, t), max(last, t))
    return spans


def assert_attempts_never_overlap(ticks: Path) -> dict[int, tuple[float, float]]:
    spans = attempt_spans(ticks)
    assert len(spans) >= 2, spans
    for earlier, later in itertools.pairwise(sorted(spans)):
        assert spans[earlier][1] < spans[later][0], (
            f"attempt {earlier} still ran at {spans[earlier][1]:.3f}, after attempt {later} started at {spans[later][0]:.3f}"
        )
    return spans


def wait_for_file(path: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)
    return path.read_text()


def event(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(e for e in job["events"] if e["kind"] == kind)


def fleet_node(platform: Platform, node_id: str) -> dict[str, Any]:
    with platform.client("admin-token") as http:
        return dict(next(n for n in http.get("/v1/fleet").json()["nodes"] if n["id"] == node_id))


def wait_for_node(platform: Platform, node_id: str, state: str, schedulable: bool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (node := fleet_node(platform, node_id))["state"] != state or node["schedulable"] != schedulable:
        assert time.monotonic() < deadline, node
        time.sleep(0.3)


@only("sqlite")
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
    assert done["end_reason"] == "all members exited 0"
    first, second = log_of(platform, job["id"], 1), log_of(platform, job["id"], 2)
    assert "starting from step 0" in first  # RESUME_FROM is empty on the first attempt
    stopped_at = int(re.search(r"SIGTERM: checkpointed step (\d+)", first).group(1))  # type: ignore[union-attr]
    assert resumed_step(second) == stopped_at > 0
    assert "finished 150 steps" in second
    kinds = [e["kind"] for e in done["events"]]
    assert kinds.index("PREEMPTING") < kinds.index("REQUEUED") < kinds.index("SUCCEEDED")
    assert done["latest_checkpoint"].endswith(".npz")


@only("postgres")
def test_preempt_from_the_temporal_cli_and_refusal_when_not_running(platform: Platform) -> None:
    job = platform.submit(training_spec("preempt-cli", steps=150))
    signalled = platform.submit(training_spec("preempt-signal", steps=150))
    wait_for_checkpoint(platform, job["id"])
    wait_for_checkpoint(platform, signalled["id"])
    temporal = [temporal_binary(), "workflow"]
    where = ["--address", platform.temporal_address]
    update = [*temporal, "update", "execute", *where, "--workflow-id", job["id"], "--name", "preempt"]
    out = subprocess.run([*update, "--input", '{"reason": "from the temporal cli"}'], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # The signal (no answer): the same graceful stop and requeue.
    signal_ = [*temporal, "signal", *where, "--workflow-id", signalled["id"], "--name", "preempt"]
    out = subprocess.run([*signal_, "--input", '{"reason": "by temporal signal"}'], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for preempted, reason in ((job, "from the temporal cli"), (signalled, "by temporal signal")):
        done = platform.wait_for(preempted["id"], TERMINAL, timeout=120)
        assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done
        assert event(done, "PREEMPTING")["message"] == reason
        assert event(done, "REQUEUED")["message"] == f"preempted: {reason}"
        assert resumed_step(log_of(platform, preempted["id"], 2)) > 0
    with platform.client("alpha-token") as http:
        refused = http.post(f"/v1/jobs/{job['id']}/preempt")
    assert refused.status_code == 409 and "SUCCEEDED" in refused.text


@only("sqlite")
def test_preempt_by_the_cli_stops_the_whole_group_and_kills_only_after_the_grace(platform: Platform, tmp_path: Path) -> None:
    """A member that ignores SIGTERM, with a grace period longer than the heartbeat timeout (5 s), and a child.

    The child (same process group) gets the SIGTERM; the member is SIGKILLed only after the whole grace
    period, its agent heartbeats meanwhile (nothing is "lost"), and the allocation is released only once
    the member is gone.
    """
    child = (
        "import os, signal, sys, time\n"
        f"d = {str(tmp_path)!r}\n"
        "signal.signal(signal.SIGTERM, lambda *a: (open(d + '/child.term', 'w').write('1'), sys.exit(0)))\n"
        "open(d + '/child.pid', 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    code = (
        "import os, signal, subprocess, sys, time\n"
        "if os.environ['FAIRGANG_ATTEMPT'] != '1':\n    print('attempt 2 runs', flush=True); time.sleep(600)\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        f"open({str(tmp_path / 'parent.pid')!r}, 'w').write(str(os.getpid()))\n"
        "while True:\n    time.sleep(0.1)\n"
    )
    grace = 8.0
    job = platform.submit(job_spec("ignores-term", code, grace_period=f"{grace:.0f}s"))
    parent, kid = int(wait_for_file(tmp_path / "parent.pid")), int(wait_for_file(tmp_path / "child.pid"))
    env = {**os.environ, "FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": "alpha-token"}
    cli = [sys.executable, "-m", "cli", "preempt", job["id"], "--reason", "by the fairgang cli"]
    out = subprocess.run(cli, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    wait_for_file(tmp_path / "child.term", timeout=30)  # the SIGTERM reached the whole group ...
    assert pid_alive(parent), "... but the member itself ignores it, and lives on through the grace period"
    deadline = time.monotonic() + 120
    while True:
        seen = platform.job(job["id"])
        if not pid_alive(parent):
            died_by = time.time()
            break
        # The member was alive after this answer was read, so the answer must still hold its GPUs.
        [first] = [a for a in seen["allocations"] if a["attempt"] == 1]
        assert first["state"] != "RELEASED", "the GPUs were released while the member still ran"
        assert seen["state"] == "PREEMPTING" or seen["attempt"] == 1, seen
        assert time.monotonic() < deadline, "the member was never SIGKILLed"
        time.sleep(0.3)
    assert not pid_alive(kid)
    seen = platform.wait_for(job["id"], {"RUNNING"}, timeout=90)
    assert seen["attempt"] == 2
    preempting, requeued = event(seen, "PREEMPTING"), event(seen, "REQUEUED")
    assert preempting["message"] == "by the fairgang cli"
    # SIGKILL came a whole grace period after the SIGTERM, which followed PREEMPTING (1 s for clock slack).
    assert died_by >= preempting["ts"] + grace - 1.0
    assert requeued["message"] == "preempted: by the fairgang cli" and requeued["ts"] >= preempting["ts"] + grace - 1.0
    assert not any("lost" in e["message"] for e in seen["events"]), seen["events"]
    # The end reason of a cancel.
    with platform.client("alpha-token") as http:
        assert http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    done = platform.wait_for(job["id"], TERMINAL)
    assert done["state"] == "CANCELLED" and done["end_reason"] == "cancelled by tenant alpha", done


@only("postgres")
def test_gang_member_failure_stops_the_other_member(platform: Platform, tmp_path: Path) -> None:
    pid_file = tmp_path / "rank0.pid"
    code = (
        "import os, signal, sys, time\n"
        "if os.environ['RANK'] == '1':\n    time.sleep(2); sys.exit(5)\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('rank 0 stopped by SIGTERM', flush=True), sys.exit(0)))\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(600)\n"
    )
    job = platform.submit(job_spec("gang-fail", code, gpu_count=16, grace_period="2s"))
    done = platform.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "FAILED" and done["exit_code"] == 5, done
    assert "member 1 exited with code 5" in done["end_reason"]
    # The spec's default is no retry: one attempt, never queued again.
    assert done["attempt"] == 1 and "REQUEUED" not in [e["kind"] for e in done["events"]]
    assert not pid_alive(int(pid_file.read_text()))
    # Stopped gracefully (SIGTERM reached it), not just killed.
    assert "rank 0 stopped by SIGTERM" in log_of(platform, job["id"], 1, rank=0)


@only("sqlite")
def test_own_failures_retry_as_the_spec_says_then_succeed(platform: Platform) -> None:
    # A 16-GPU gang: rank 1 fails on the first attempt, so the whole gang goes again.
    code = (
        "import os, sys, time\n"
        "attempt, rank = os.environ['FAIRGANG_ATTEMPT'], os.environ['RANK']\n"
        "print('attempt', attempt, 'rank', rank, flush=True)\n"
        "if attempt == '1':\n    time.sleep(1 if rank == '1' else 600); sys.exit(9)\n"
    )
    gang = platform.submit(job_spec("retry-once", code, gpu_count=16, grace_period="2s", retries=1))
    # Retries run out: FAILED after 1 + retries attempts, with the reason.
    always = job_spec("retry-runs-out", "import sys; sys.exit(3)", gpu_type="L40S", retries=1, checkpoint_dir="/ckpt/alpha/r")
    failing = platform.submit(always)
    done = platform.wait_for(gang["id"], TERMINAL)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done
    assert event(done, "REQUEUED")["message"] == "job failed (member 1 exited with code 9); retry 1 of 1"
    for rank in (0, 1):
        assert f"attempt 1 rank {rank}" in log_of(platform, gang["id"], 1, rank)
        assert f"attempt 2 rank {rank}" in log_of(platform, gang["id"], 2, rank)
    failed = platform.wait_for(failing["id"], TERMINAL)
    assert failed["state"] == "FAILED" and failed["attempt"] == 2 and failed["exit_code"] == 3, failed
    assert failed["end_reason"] == "member 0 exited with code 3"
    assert [e["kind"] for e in failed["events"]].count("REQUEUED") == 1


@only("postgres")
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

    async def temporal_says() -> tuple[Any, BaseException | None]:
        handle = (await Client.connect(platform.temporal_address)).get_workflow_handle(job["id"])
        try:
            await handle.result()
        except WorkflowFailureError as err:
            return (await handle.describe()).status, err.cause
        return (await handle.describe()).status, None

    status, cause = asyncio.run(temporal_says())
    assert status == WorkflowExecutionStatus.FAILED, status
    assert isinstance(cause, ApplicationError) and cause.type == "JobTimedOut" and cause.non_retryable, cause


def _kill_part(platform: Platform, name: str) -> int:
    pids = json.loads((platform.data_dir / "pids.json").read_text())
    os.kill(pids[name], signal.SIGKILL)
    return int(pids[name])


@only("postgres")
def test_node_loss_requeues_and_resumes_on_another_node(platform: Platform, tmp_path: Path) -> None:
    # The member ignores SIGTERM: only the SIGKILL after its grace period ends it, with its agent gone.
    ticks = tmp_path / "ticks"
    job = platform.submit(timed_training_spec("survives-node-loss", ticks, steps=200, every=10, env={"IGNORE_TERM": "1:0"}))
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
        # The job's own record of when each attempt was alive: never two at once.
        assert_attempts_never_overlap(ticks)
        assert [a["state"] for a in done["allocations"] if a["attempt"] == 1] == ["RELEASED"]
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


@only("sqlite")
def test_losing_one_node_of_a_gang_requeues_the_whole_gang(platform: Platform, tmp_path: Path) -> None:
    """kill -9 of one gang member's agent, held down: the whole gang stops and is queued again.

    The member on the lost node ignores SIGTERM, and its agent is gone; it must still be dead before the
    job is queued again. The idle L40S node's agent is killed too: the placement service declares it LOST.
    """
    ticks = tmp_path / "ticks"
    spec = timed_training_spec("gang-loses-a-node", ticks, steps=300, gpu_count=16, topology={"level": "leaf"}, env={"IGNORE_TERM": "1:1"})
    job = platform.submit(spec)
    running = wait_for_checkpoint(platform, job["id"])
    nodes = {m["rank"]: m["node_id"] for m in running["allocation"]["members"]}
    (platform.data_dir / "hold").mkdir(exist_ok=True)
    holds = [platform.data_dir / "hold" / f"agent-{n}" for n in (nodes[1], "g1")]
    for hold in holds:
        hold.touch()
    try:
        _kill_part(platform, f"agent-{nodes[1]}")
        _kill_part(platform, "agent-g1")
        queued = platform.wait_for(job["id"], {"QUEUED"}, timeout=90)
        assert queued["attempt"] == 2, queued
        requeued = event(queued, "REQUEUED")
        assert f"node(s) {nodes[1]} lost" in requeued["message"] or "lost (no heartbeat)" in requeued["message"], requeued
        # No member of the first attempt outlived it: not the one on the live node (stopped gracefully, it
        # checkpointed), nor the one that ignores SIGTERM on the node whose agent is still down.
        assert "SIGTERM: checkpointed step" in log_of(platform, job["id"], 1, rank=0)
        for rank in (0, 1):
            assert not pid_alive(int((tmp_path / f"ticks.pid-1-{rank}").read_text())), f"rank {rank} of attempt 1 still runs"
        assert attempt_spans(ticks)[1][1] < requeued["ts"], "attempt 1 still ran when the job was queued again"
        assert [a["state"] for a in queued["allocations"] if a["attempt"] == 1] == ["RELEASED"]
        # Each member saw the rendezvous of rank 0's node, and no checkpoint on the first attempt.
        first = next(a for a in queued["allocations"] if a["attempt"] == 1)
        for rank in (0, 1):
            line = f"env NODE_RANK='{rank}' MASTER_ADDR='127.0.0.1' MASTER_PORT='{master_port(first['id'])}' RESUME_FROM=''"
            assert line in log_of(platform, job["id"], 1, rank)
        # The idle node is declared LOST by the placement service alone; nothing new goes there.
        wait_for_node(platform, "g1", "LOST", schedulable=False, timeout=60)
        waiting = platform.submit(job_spec("waits-for-g1", "print('g1 is back')", gpu_type="L40S", checkpoint_dir="/ckpt/alpha/g1"))
        deadline = time.monotonic() + 30
        while not (seen := platform.job(waiting["id"]))["pending_reason"]:
            assert time.monotonic() < deadline, seen
            time.sleep(0.3)
        assert seen["state"] == "QUEUED", seen
    finally:
        for hold in holds:
            hold.unlink()
    done = platform.wait_for(job["id"], TERMINAL, timeout=150)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done
    for rank in (0, 1):
        assert resumed_step(log_of(platform, job["id"], 2, rank)) > 0
    assert_attempts_never_overlap(ticks)
    assert platform.wait_for(waiting["id"], TERMINAL, timeout=90)["state"] == "SUCCEEDED"
    for node_id in (nodes[1], "g1"):
        wait_for_node(platform, node_id, "READY", schedulable=True)


def test_a_frozen_agents_member_is_fenced_by_its_shim_and_its_late_heartbeat_revives_nothing(platform: Platform, tmp_path: Path) -> None:
    """SIGSTOP of the agent running a member that ignores SIGTERM, longer than the lost-node timeout.

    Nothing can reach the member through its agent: its shim must stop it when its lease runs out (no
    keepalive), before the workflow, which revokes the allocation and waits out the lease and the grace
    period, queues the job again. The node is declared LOST; attempt 2 runs elsewhere, never alongside
    attempt 1. Then SIGCONT: the agent's late heartbeat is refused and revives nothing.
    """
    ticks = tmp_path / "ticks"
    job = platform.submit(timed_training_spec("survives-frozen-agent", ticks, steps=200, every=10, env={"IGNORE_TERM": "1:0"}))
    running = wait_for_checkpoint(platform, job["id"])
    frozen_node = running["allocation"]["members"][0]["node_id"]
    member = int(wait_for_file(tmp_path / "ticks.pid-1-0"))
    agent = int(json.loads((platform.data_dir / "pids.json").read_text())[f"agent-{frozen_node}"])
    os.kill(agent, signal.SIGSTOP)
    try:
        wait_for_node(platform, frozen_node, "LOST", schedulable=False, timeout=90)
        deadline = time.monotonic() + 120
        while (seen := platform.job(job["id"]))["attempt"] < 2 or seen["state"] != "RUNNING":
            assert time.monotonic() < deadline, seen
            time.sleep(0.3)
        # The agent is still frozen: the shim alone stopped attempt 1, which ignored SIGTERM.
        assert not pid_alive(member), "attempt 1 still runs on the frozen agent's node"
        assert "no keepalive from the agent" in log_of(platform, job["id"], 1)
        assert frozen_node not in [m["node_id"] for m in seen["allocation"]["members"]]
        kinds = [e["kind"] for e in seen["events"]]
        assert kinds.index("REVOKED") < kinds.index("REQUEUED"), kinds
        while 2 not in attempt_spans(ticks):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        os.kill(agent, signal.SIGCONT)
    done = platform.wait_for(job["id"], TERMINAL, timeout=150)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done
    assert resumed_step(log_of(platform, job["id"], 2)) > 0
    # The late heartbeat revived nothing: attempt 1's allocation stays released, and the node comes back
    # only by registering again, holding nothing.
    assert [a["state"] for a in done["allocations"] if a["attempt"] == 1] == ["RELEASED"]
    assert_attempts_never_overlap(ticks)
    wait_for_node(platform, frozen_node, "READY", schedulable=True)


def test_kill_9_of_the_agent_running_a_member_keeps_the_attempt_going(platform_factory: Any, tmp_path: Path) -> None:
    """kill -9 of a member's agent, restarted at once (as a service manager would): the member runs on under its
    shim, the restarted agent adopts it when its launch, which stopped heartbeating, comes again, and the first
    attempt goes on to SUCCEEDED, reporting its checkpoints to the end. (A platform whose leases outlast a
    restart on a loaded machine: the module's are short, for the tests of losses.)"""
    platform: Platform = platform_factory()
    platform.extra_env.update(RESTART_WITHIN_LEASE)
    platform.start()
    ticks, pause = tmp_path / "ticks", tmp_path / "pause"
    job = platform.submit(timed_training_spec("survives-agent-restart", ticks, steps=400, every=20, env={"PAUSE_WHILE": str(pause)}))
    running = wait_for_checkpoint(platform, job["id"])
    node = running["allocation"]["members"][0]["node_id"]
    member = int(wait_for_file(tmp_path / "ticks.pid-1-0"))
    # The member waits (alive, not training) until its agent is back, however long a loaded machine takes.
    pause.touch()
    old_agent = _kill_part(platform, f"agent-{node}")
    agent_log = platform.data_dir / "process-logs" / f"agent-{node}.log"
    deadline = time.monotonic() + 60
    while f"adopting the member of {job['id']}" not in agent_log.read_text(errors="replace"):
        assert time.monotonic() < deadline and pid_alive(member), platform.logs()
        time.sleep(0.3)
    new_agent = int(json.loads((platform.data_dir / "pids.json").read_text())[f"agent-{node}"])
    assert new_agent != old_agent and pid_alive(member), "the member did not outlive its agent"
    adopted_at = platform.job(job["id"])["latest_checkpoint"]
    pause.unlink()
    done = platform.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 1, done
    assert not any(e["kind"] in ("REQUEUED", "REVOKED") for e in done["events"]), done["events"]
    assert set(attempt_spans(ticks)) == {1}
    # One process from start to end: never stopped, never started again.
    assert "SIGTERM" not in log_of(platform, job["id"], 1) and "resumed from step" not in log_of(platform, job["id"], 1)
    assert done["latest_checkpoint"] != adopted_at, "no checkpoint was reported after the adoption"


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
        # Restarted within the member's lease, the agent adopts it and the attempt goes on (tested on its own
        # above); on a machine too loaded to restart it within this platform's 8 s lease, it is queued again and
        # resumes from its checkpoint. Either way nothing is lost.
        done = platform.job(running["id"])
        if done["attempt"] >= 2:
            assert resumed_step(log_of(platform, running["id"], done["attempt"])) > 0
