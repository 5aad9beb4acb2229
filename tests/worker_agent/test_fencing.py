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
from temporalio.activity import ActivityCancellationDetails
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from fairgang.settings import Settings
from tests.worker_agent.test_stop import until
from worker_agent.agent import NodeAgent
from worker_agent.gpus import SimulatedGpus
from worker_agent.launch import LaunchActivities, RunningMember, pid_alive
from worker_agent.shim import lease_clock
from workflows.job import AGENT_RESTARTING, MEMBER_FENCED
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


#: A member that writes its pid and runs until SIGTERM ends it (exit status -15).
SLEEPER = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(600)\n"


def adoptable_launcher(tmp_path: Path, lease: float) -> LaunchActivities:
    """A run of the agent's launcher whose members outlive it within their lease (state dir and lease)."""
    return LaunchActivities(node_id="h1", log_dir=tmp_path / "logs", state_dir=tmp_path / "state", lease_s=lease)


def activity_env() -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC))
    return env


async def start_then_stop_the_agent(tmp_path: Path, launcher: LaunchActivities, inp: LaunchInput, renew_for_s: float) -> int:
    """Launch a member, renew its lease as heartbeats would for ``renew_for_s``, then stop the agent (its worker
    shuts down: the member runs on for the next run to adopt). The member's pid."""
    env = activity_env()
    launch = asyncio.create_task(env.run(launcher.launch, inp))
    pid_file = Path(inp.argv[-1])
    await until(lambda: pid_file.exists() and pid_file.read_text() and inp.allocation_id in launcher.running)
    renewed_until = asyncio.get_running_loop().time() + renew_for_s
    while asyncio.get_running_loop().time() < renewed_until:
        launcher.renew([inp.allocation_id], lease_clock())
        await asyncio.sleep(0.2)
    env.cancel(ActivityCancellationDetails(worker_shutdown=True))
    with pytest.raises(ApplicationError) as stopping:
        await launch
    assert stopping.value.type == AGENT_RESTARTING
    return int(await asyncio.to_thread(pid_file.read_text))


def sleeper_input(tmp_path: Path) -> LaunchInput:
    return LaunchInput(
        job_id="j", attempt=1, allocation_id="a-1", node_id="h1", rank=0, world_size=1, gpu_indices=[0], gpus_per_member=1,
        argv=[sys.executable, "-c", SLEEPER, str(tmp_path / "member.pid")], env={}, checkpoint_dir=str(tmp_path / "ckpt"),
        grace_period_s=1.0, master_addr="h1", master_port=29500,
    )  # fmt: skip


@pytest.mark.parametrize("renewal", ["after the lease ran out", "as the shim stopped it"])
async def test_a_member_whose_lease_ran_out_while_no_agent_ran_ends_fenced_not_failed(tmp_path: Path, renewal: str) -> None:
    """The agent restarts later than the lease: the shim stopped the member (SIGTERM: exit status -15). The store
    still holds the allocation (the node is not declared lost yet), so the next run adopts the member and the
    registration's answer holds it; that answer must not revive the lease, and the launch must say the member
    was fenced (the workflow runs the job again) rather than that the job exited with -15 (the job fails).
    A renewal that lands just as the shim gives up (the agent believes the lease renewed) changes nothing: the
    shim's exit file says it stopped the member."""
    lease = 1.5
    inp = sleeper_input(tmp_path)
    first = adoptable_launcher(tmp_path, lease)
    pid = await start_then_stop_the_agent(tmp_path, first, inp, renew_for_s=0.0)
    try:
        exit_file = tmp_path / "state" / "a-1-rank-0.exit"
        await until(exit_file.exists)  # no agent renews the lease: its shim stops the member
        second = adoptable_launcher(tmp_path, lease)
        orphans = second.orphans()
        assert [m.allocation_id for m in orphans] == ["a-1"]
        assert second.exit_status(orphans[0]) == -signal.SIGTERM
        second.adopt(orphans[0])
        if renewal == "after the lease ran out":
            second.renew(["a-1"], lease_clock())  # the registration's answer holds the allocation
            assert orphans[0].lease_until <= lease_clock(), "an answer revived a lease that had run out"
        else:
            orphans[0].lease_until = lease_clock() + lease
        try:
            result = await asyncio.wait_for(activity_env().run(second.launch, inp), 30)
        except ApplicationError as fenced:
            assert fenced.type == MEMBER_FENCED
        else:
            raise AssertionError(f"the launch returned {result}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


async def test_the_next_run_of_the_agent_holds_the_lease_its_last_renewal_wrote(tmp_path: Path) -> None:
    """Renewals go to the member's lease file, not its state file: the next run starts from the last of them (not
    from the launch's lease, long over), so renewing it within that lease keeps the member running."""
    lease = 1.5
    inp = sleeper_input(tmp_path)
    first = adoptable_launcher(tmp_path, lease)
    pid = await start_then_stop_the_agent(tmp_path, first, inp, renew_for_s=3 * lease)
    try:
        second = adoptable_launcher(tmp_path, lease)
        (member,) = second.orphans()
        assert member.lease_until == pytest.approx(first.running["a-1"].lease_until, abs=1e-5)
        second.adopt(member)
        kept_until = asyncio.get_running_loop().time() + 3 * lease
        while asyncio.get_running_loop().time() < kept_until:
            second.renew(["a-1"], lease_clock())
            assert pid_alive(pid), "the member was stopped although the next run renewed its lease in time"
            await asyncio.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
