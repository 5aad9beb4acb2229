"""The launch activity: run one gang member's process on this node (SPEC R5.1).

It runs as an async activity on the node's task queue. The process gets its own
process group; on cancellation the whole group gets SIGTERM, the activity keeps
heartbeating through the grace period, then SIGKILLs what is left, so the workflow
(which waits for cancellation to complete) releases the GPUs only after the
processes are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

from temporalio import activity

from workflows.messages import LaunchInput, LaunchResult, MemberStarted

HEARTBEAT_EVERY_S = 1.0


def log_path(log_dir: Path, job_id: str, attempt: int, rank: int) -> Path:
    """Where a member's stdout and stderr go: one file per attempt and rank."""
    return log_dir / job_id / f"attempt-{attempt}-rank-{rank}.log"


def job_environment(inp: LaunchInput, base: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment: the host's, then the spec's, then the platform's."""
    env = dict(os.environ if base is None else base)
    env.update(inp.env)
    env.update(
        {
            "FAIRGANG_JOB_ID": inp.job_id,
            "FAIRGANG_ATTEMPT": str(inp.attempt),
            "CHECKPOINT_DIR": inp.checkpoint_dir,
            "RESUME_FROM": inp.resume_from,
            "WORLD_SIZE": str(inp.world_size * inp.gpus_per_member),
            "RANK": str(inp.rank),
            "NODE_RANK": str(inp.rank),
            "LOCAL_WORLD_SIZE": str(inp.gpus_per_member),
            "MASTER_ADDR": inp.master_addr,
            "MASTER_PORT": str(inp.master_port),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in inp.gpu_indices),
        }
    )
    return env


class LaunchActivities:
    """Runs members as local processes (the process runtime)."""

    def __init__(self, *, node_id: str, log_dir: Path, running: dict[str, asyncio.subprocess.Process] | None = None) -> None:
        self.node_id = node_id
        self.log_dir = log_dir
        #: allocation id -> process, for the agent's fencing and status reports.
        self.running: dict[str, asyncio.subprocess.Process] = {} if running is None else running

    @activity.defn(name="launch")
    async def launch(self, inp: LaunchInput) -> LaunchResult:
        path = log_path(self.log_dir, inp.job_id, inp.attempt, inp.rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as log:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *inp.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    env=job_environment(inp),
                    start_new_session=True,
                )
            except OSError as err:
                log.write(f"fairgang: could not start {inp.argv[0]!r}: {err}\n".encode())
                return LaunchResult(exit_code=127, how="start_failed", error=str(err))
        self.running[inp.allocation_id] = proc
        try:
            await self._tell_started(inp, proc.pid)
            return await self._watch(proc, inp)
        finally:
            self.running.pop(inp.allocation_id, None)

    async def _tell_started(self, inp: LaunchInput, pid: int) -> None:
        with contextlib.suppress(Exception):
            handle = activity.client().get_workflow_handle(inp.job_id)
            await handle.signal("member_started", MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=pid))

    async def _watch(self, proc: asyncio.subprocess.Process, inp: LaunchInput) -> LaunchResult:
        try:
            while True:
                activity.heartbeat()
                try:
                    code = await asyncio.wait_for(asyncio.shield(proc.wait()), HEARTBEAT_EVERY_S)
                except TimeoutError:
                    continue
                return LaunchResult(exit_code=code, how="exited")
        except asyncio.CancelledError:
            await stop_process_group(proc, inp.grace_period_s, heartbeat=activity.heartbeat)
            raise


async def stop_process_group(proc: asyncio.subprocess.Process, grace_s: float, heartbeat: object = None) -> int | None:
    """SIGTERM the process group, wait up to ``grace_s`` (heartbeating), then SIGKILL it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while proc.returncode is None and loop.time() < deadline:
        if callable(heartbeat):
            heartbeat()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), min(HEARTBEAT_EVERY_S, max(deadline - loop.time(), 0.01)))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return await proc.wait()
