"""The agent's fencing rules: kill members the store no longer holds (never ones it cannot know of yet), and
stop members whose lease ran out because the agent lost the control plane."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from fairgang.settings import Settings
from worker_agent.agent import NodeAgent
from worker_agent.gpus import SimulatedGpus
from worker_agent.launch import RunningMember, pid_alive
from workflows.job import MEMBER_FENCED
from workflows.messages import LaunchInput


def agent(tmp_path: Path) -> NodeAgent:
    settings = Settings(api_url="http://127.0.0.1:1", agent_state_dir=tmp_path / "state", log_dir=tmp_path / "logs")
    return NodeAgent(settings=settings, node_id="h1", gpu_type="H100", gpus=SimulatedGpus("h1", "H100", 8), labels={}, token="t")


def member(allocation_id: str, launched_at: float) -> RunningMember:
    """A member whose launch activity watches it."""
    return RunningMember(allocation_id, "j", 1, 0, pid=999999, grace_period_s=1.0, launched_at=launched_at, watchers=1)


def test_fence_kills_released_allocations_launched_before_the_answer_was_asked_for(tmp_path: Path) -> None:
    a = agent(tmp_path)
    killed: list[str] = []
    a.launcher.kill = killed.append  # type: ignore[method-assign, assignment]
    a.launcher.running = {"a-live": member("a-live", 10.0), "a-released": member("a-released", 10.0), "a-new": member("a-new", 25.0)}
    a.fence(["a-live"], asked_at=20.0)
    # a-new started after the request went out: the answer cannot know of it yet.
    assert killed == ["a-released"]
    a.fence(["a-live"], asked_at=30.0)
    assert killed == ["a-released", "a-new", "a-released"]


#: A member that ignores SIGTERM and writes its pid.
STUBBORN = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "while True: time.sleep(0.05)\n"
)


async def test_an_agent_cut_off_from_the_api_fences_its_member_and_the_launch_says_so(tmp_path: Path) -> None:
    """A real launch under the shim; the API answers through a transport the test cuts (a network partition)."""
    lease, grace = 1.5, 1.0
    settings = Settings(
        api_url="http://api", agent_state_dir=tmp_path / "state", log_dir=tmp_path / "logs", node_heartbeat_interval_s=0.2,
        self_fence_after_s=lease, isolate_members=False,  # pytest's tmp folders are closed to a member's own uid
    )  # fmt: skip
    a = NodeAgent(settings=settings, node_id="h1", gpu_type="H100", gpus=SimulatedGpus("h1", "H100", 8), labels={}, token="t")
    connected = True

    def answer(request: httpx.Request) -> httpx.Response:
        if not connected:
            raise httpx.ConnectError("network cut", request=request)
        return httpx.Response(200, json={"accepted": True, "live_allocations": ["a-1"], "fence": []})

    a.http = httpx.AsyncClient(base_url="http://api", transport=httpx.MockTransport(answer))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC))
    pid_file = tmp_path / "member.pid"
    inp = LaunchInput(
        job_id="j", attempt=1, allocation_id="a-1", node_id="h1", rank=0, world_size=1, gpu_indices=[0], gpus_per_member=1,
        argv=[sys.executable, "-c", STUBBORN, str(pid_file)], env={}, checkpoint_dir=str(tmp_path / "ckpt"),
        grace_period_s=grace, master_addr="h1", master_port=29500,
    )  # fmt: skip
    beats = asyncio.create_task(a.heartbeat_loop())
    launch = asyncio.create_task(env.run(a.launcher.launch, inp))
    try:
        while not pid_file.exists() or not pid_file.read_text():
            assert not launch.done(), launch
            await asyncio.sleep(0.05)
        member = int(pid_file.read_text())
        # Connected: the lease is renewed, the member runs on well past it.
        await asyncio.sleep(3 * lease)
        assert pid_alive(member) and not launch.done()
        connected = False
        with pytest.raises(ApplicationError) as fenced:
            await asyncio.wait_for(launch, 30)
        assert fenced.value.type == MEMBER_FENCED
        for _ in range(100):  # the group's SIGKILL may reach the shim before the member
            if not pid_alive(member):
                break
            await asyncio.sleep(0.1)
        assert not pid_alive(member)
        assert "no keepalive from the agent" in (tmp_path / "logs" / "j" / "attempt-1-rank-0.log").read_text()
    finally:
        beats.cancel()
        launch.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(beats, launch)
        for m in list(a.launcher.running.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(m.pid, signal.SIGKILL)
