"""The `stop` activity on real processes under the shim: it SIGTERMs the member at once, the launch waits out
the grace period counted from that SIGTERM, a repeat or a late stop does nothing, and a stop that comes before
its launch keeps the member from starting."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from worker_agent.launch import LaunchActivities, pid_alive
from workflows.messages import LaunchInput, LaunchResult, StopInput

#: A member that records each SIGTERM's wall time (one line each) in argv[1]/term, ignores it, and records
#: that it is alive every 20 ms in argv[1]/alive (the last line: the last time it was seen alive).
RECORDER = r"""
import os, signal, sys, time
d = sys.argv[1]
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


#: The member's records lag the events they record when it is not scheduled at once (a loaded machine),
#: which only makes the grace checks stricter: this much is allowed for it.
LAG_S = 0.5


def launch_input(tmp_path: Path, allocation_id: str, grace: float) -> LaunchInput:
    return LaunchInput(
        job_id="j", attempt=1, allocation_id=allocation_id, node_id="h1", rank=0, world_size=1, gpu_indices=[0],
        gpus_per_member=1, argv=[sys.executable, "-c", RECORDER, str(tmp_path)], env={},
        checkpoint_dir=str(tmp_path / "ckpt"), grace_period_s=grace, master_addr="h1", master_port=29500,
    )  # fmt: skip


def stop_input(allocation_id: str) -> StopInput:
    return StopInput(job_id="j", allocation_id=allocation_id, attempt=1, rank=0, reason="test")


def times(path: Path) -> list[float]:
    return [float(line) for line in path.read_text().split()] if path.exists() else []


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[tuple[LaunchActivities, ActivityEnvironment]]:
    launcher = LaunchActivities(node_id="h1", log_dir=tmp_path / "logs", state_dir=tmp_path / "state")
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC))
    yield launcher, env
    for member in list(launcher.running.values()):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(member.pid, signal.SIGKILL)


async def until(predicate: object, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_a_stop_terms_the_member_at_once_and_kills_it_one_grace_period_after_that_sigterm(
    node: tuple[LaunchActivities, ActivityEnvironment], tmp_path: Path
) -> None:
    launcher, env = node
    grace = 2.0
    launch = asyncio.create_task(env.run(launcher.launch, launch_input(tmp_path, "a-1", grace)))
    await until(lambda: (tmp_path / "alive").exists() and launcher.running.get("a-1") is not None and launcher.running["a-1"].started)
    pid = int((tmp_path / "pid").read_text())
    assert (await ActivityEnvironment().run(launcher.stop, stop_input("a-1"))).outcome == "signalled"
    # A repeat sends nothing and does not start the grace period over.
    await until(lambda: bool(times(tmp_path / "term")))
    assert (await ActivityEnvironment().run(launcher.stop, stop_input("a-1"))).outcome == "stopping"
    result = await asyncio.wait_for(launch, 60)
    assert isinstance(result, LaunchResult) and result.how == "terminated", result
    assert result.exit_code == -signal.SIGKILL
    await until(lambda: not pid_alive(pid))  # SIGKILLed; gone once the kernel and its parent have reaped it
    [term] = times(tmp_path / "term")
    # It was alive through the whole grace period after its one SIGTERM, then SIGKILLed.
    assert max(times(tmp_path / "alive")) >= term + grace - LAG_S
    # The attempt ended: a late stop finds nothing and does nothing.
    assert (await ActivityEnvironment().run(launcher.stop, stop_input("a-1"))).outcome == "absent"
    assert launcher.running == {}


async def test_a_cancel_during_a_stops_grace_period_neither_terms_again_nor_restarts_the_grace(
    node: tuple[LaunchActivities, ActivityEnvironment], tmp_path: Path
) -> None:
    """The launch activity's own cancellation (heartbeat path) arriving while a stop's grace period runs."""
    launcher, env = node
    grace = 3.0
    launch = asyncio.create_task(env.run(launcher.launch, launch_input(tmp_path, "a-2", grace)))
    await until(lambda: launcher.running.get("a-2") is not None and launcher.running["a-2"].started and (tmp_path / "alive").exists())
    await ActivityEnvironment().run(launcher.stop, stop_input("a-2"))
    await until(lambda: bool(times(tmp_path / "term")))
    await asyncio.sleep(1.0)
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(launch, 60)
    # One SIGTERM (the cancel sent none), and the member lived through the grace period counted from it.
    [term] = times(tmp_path / "term")
    assert max(times(tmp_path / "alive")) >= term + grace - LAG_S
    assert launcher.running == {}


async def test_a_stop_that_comes_before_its_launch_keeps_the_member_from_starting(
    node: tuple[LaunchActivities, ActivityEnvironment], tmp_path: Path
) -> None:
    launcher, env = node
    assert (await ActivityEnvironment().run(launcher.stop, stop_input("a-3"))).outcome == "absent"
    result = await asyncio.wait_for(env.run(launcher.launch, launch_input(tmp_path, "a-3", 1.0)), 30)
    assert result.how == "terminated" and result.exit_code is None, result
    assert not (tmp_path / "pid").exists()
    # Consumed: the request does not linger for another launch.
    assert launcher.stop_requests == {}
