"""The launch activity: run one gang member's process on this node (SPEC R5.1).

It runs as an async activity on the node's task queue. The process runs under a small
supervisor (``worker_agent/shim.py``) in a process group of its own. To stop it (preempt, cancel, max
runtime, a failed gang member, a lost node) the workflow runs the short ``stop`` activity on the same
queue (:meth:`LaunchActivities.stop`): the whole group gets SIGTERM at once, the launch activity keeps
heartbeating through the grace period counted from that SIGTERM, SIGKILLs what is left and returns
"terminated". The workflow also cancels the launch activity, which reaches it only with a heartbeat
answer (the SDK sends heartbeats at most every 0.8 x heartbeat timeout): the same stop, kept for a
workflow or an agent from before the ``stop`` activity. The workflow waits for the launch to end, so the
GPUs are released only after the processes are gone. When the agent itself dies, the shim
does the same stop on its own, so a member that ignores SIGTERM still ends one grace
period later; and each member holds a lease that its agent renews only with heartbeat
answers that still hold its allocation (:meth:`LaunchActivities.renew`), so a frozen or
cut-off agent's members stop too (``self_fence_after_s`` after the last such heartbeat was
sent, then the grace period).

Checkpoints: the job writes the path of its newest checkpoint into ``CHECKPOINT_DIR/LATEST``
(see :func:`read_latest_marker`); rank 0's activity watches that marker and reports each
change to the workflow, which records it and hands it to the next attempt as
``RESUME_FROM``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from fairgang.fencing import ended_fenced, first_lease_until, lease_expired, renewed_lease_until
from fairgang.settings import log_path
from worker_agent.isolation import RunAs, drop_private_tmp, hand_over, keep_private, private_tmp
from worker_agent.shim import lease_clock
from workflows.messages import (
    AGENT_RESTARTING,
    MEMBER_FENCED,
    MEMBER_GONE,
    CheckpointReport,
    LaunchInput,
    LaunchResult,
    MemberStarted,
    StopInput,
    StopResult,
)

HEARTBEAT_EVERY_S = 1.0
#: Past a container's grace period, how long its shim gets to finish stopping it (the CLI's own time).
CONTAINER_STOP_MARGIN_S = 10.0
PR_SET_PDEATHSIG = 1
LATEST_MARKER = "LATEST"
#: How long a stop for an allocation with no member here is remembered (its launch may not have begun).
STOP_REQUEST_TTL_S = 3600.0
log = logging.getLogger("fairgang.launch")


def host_checkpoint_dir(checkpoint_root: Path | None, checkpoint_dir: str) -> Path:
    """Where the spec's checkpoint path lives on this node (under the node's storage root)."""
    if checkpoint_root is None:
        return Path(checkpoint_dir)
    return checkpoint_root / checkpoint_dir.lstrip("/")


def read_latest_marker(checkpoint_dir: Path, job_view: str | None = None) -> str:
    """The job's newest checkpoint: the first line of ``LATEST``, as the job sees it.

    A relative path is taken from the checkpoint dir; ``job_view`` is that dir as the job
    sees it (inside a container), ``checkpoint_dir`` where this agent reads it.
    """
    try:
        text = (checkpoint_dir / LATEST_MARKER).read_text().strip().splitlines()
    except OSError:
        return ""
    if not text or not text[0].strip():
        return ""
    path = Path(text[0].strip())
    return str(path if path.is_absolute() else Path(job_view or checkpoint_dir) / path)


def job_environment(inp: LaunchInput, checkpoint_dir: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The job's environment: the host's (``base``), then the spec's, then the platform's."""
    env = dict(os.environ if base is None else base)
    for key in [k for k in env if k.startswith("FAIRGANG_") or k == "DATABASE_URL"]:
        del env[key]  # the platform's own settings and secrets are not the job's business
    env.update(inp.env)
    env.update(
        {
            "FAIRGANG_JOB_ID": inp.job_id,
            "FAIRGANG_ATTEMPT": str(inp.attempt),
            "CHECKPOINT_DIR": checkpoint_dir,
            "RESUME_FROM": inp.resume_from,
            # torchrun's contract: a member (one per node) is one launcher of NPROC_PER_NODE processes...
            "NNODES": str(inp.world_size),
            "NODE_RANK": str(inp.rank),
            "NPROC_PER_NODE": str(len(inp.gpu_indices)),
            # ...and, run as a single process, the process of rank NODE_RANK among NNODES (torchrun sets
            # these again for the processes it starts).
            "RANK": str(inp.rank),
            "WORLD_SIZE": str(inp.world_size),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": str(inp.rank),
            "GROUP_WORLD_SIZE": str(inp.world_size),
            "MASTER_ADDR": inp.master_addr,
            "MASTER_PORT": str(inp.master_port),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in inp.gpu_indices),
        }
    )
    return env


@dataclass
class RunningMember:
    """A member process this agent started."""

    allocation_id: str
    job_id: str
    attempt: int
    rank: int
    pid: int
    grace_period_s: float
    #: "process", or the container CLI ("podman", "docker") that runs it as ``container``.
    runtime: str = "process"
    container: str = ""
    proc: asyncio.subprocess.Process | None = None
    #: The node's GPUs it was given (the agent reports them busy).
    gpu_indices: list[int] = field(default_factory=list)
    #: When its launch activity began (lease_clock()): a store answer read before then cannot know of it.
    launched_at: float = 0.0
    #: Its lease (lease_clock()): past this without a renewal, its shim stops it and the agent fences it.
    lease_until: float = float("inf")
    #: The write end of its shim's keepalive pipe (-1: none).
    keepalive_fd: int = -1
    #: Its shim reported the member's process started (a SIGTERM now reaches the shim's handler).
    started: bool = False
    #: When the agent sent its group SIGTERM (time.monotonic()): its grace period counts from then.
    term_at: float | None = None
    #: Set by a stop request: its launch activity stops it.
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: The tenant whose uid it runs as (isolated members only), and that uid (None: the agent's own).
    tenant: str = ""
    uid: int | None = None
    #: Rank 0: the newest checkpoint its launch reported, and how many reports it sent (an adopting launch
    #: goes on numbering from there, so the workflow does not take its reports for old ones).
    checkpoint: str = ""
    reports: int = 0
    #: Launch activities watching it now (an adopted member has none until its launch comes again).
    watchers: int = 0


#: RunningMember fields that live only in this process (not written to the state file).
_LOCAL_FIELDS = ("proc", "keepalive_fd", "started", "term_at", "stop", "watchers")


#: Records a checkpoint report in the store; True when it was (False: try again later).
CheckpointReporter = Callable[[CheckpointReport], Awaitable[bool]]


@dataclass
class CheckpointsSeen:
    """What rank 0's launch activity has seen of the job's LATEST marker: the newest checkpoint, and how many it
    reported (each report carries its number, so the workflow and the store can tell an older one that came late)."""

    path: str
    reports: int = 0


class LaunchActivities:
    """Runs members as local processes (the process runtime)."""

    def __init__(
        self,
        *,
        node_id: str,
        log_dir: Path,
        checkpoint_root: Path | None = None,
        state_dir: Path | None = None,
        runtime: str = "process",
        gpu_devices: bool = False,
        lease_s: float | None = None,
        run_as: RunAs | None = None,
        report_checkpoint: CheckpointReporter | None = None,
    ) -> None:
        self.node_id = node_id
        #: Records a rank 0 member's newest checkpoint in the store (the agent: through the API); True when
        #: recorded. None: the launch signals its job's workflow instead (agents from before the store kept them).
        self.report_checkpoint = report_checkpoint
        #: Run each member as its tenant's own uid (worker_agent/isolation.py); None: as this process's uid.
        self.run_as = run_as
        #: The member lease (the agent's self_fence_after_s); None: members hold no lease (tests).
        self.lease_s = lease_s
        #: "process" runs argv here; "podman" or "docker" runs the spec's image with that CLI.
        self.runtime = runtime
        #: Containers: pass the member's GPUs as CDI devices (real GPU nodes only).
        self.gpu_devices = gpu_devices
        self.log_dir = log_dir
        self.checkpoint_root = checkpoint_root
        #: One JSON file per running member, so that a restarted agent finds what it left behind.
        self.state_dir = state_dir
        #: allocation id -> member, for fencing and status reports.
        self.running: dict[str, RunningMember] = {}
        #: Allocations whose processes the agent killed on its own (fencing); their end is not the job's.
        self.fenced: set[str] = set()
        #: allocation id -> when a stop came for it with no member here (time.monotonic()).
        self.stop_requests: dict[str, float] = {}

    @property
    def adoptable(self) -> bool:
        """Members outlive this agent within their lease, for its next run to adopt (a state dir and leases)."""
        return self.state_dir is not None and self.lease_s is not None

    @activity.defn(name="launch")
    async def launch(self, inp: LaunchInput) -> LaunchResult:
        launched_at = lease_clock()
        path = log_path(self.log_dir, inp.job_id, inp.attempt, inp.rank)
        ckpt = host_checkpoint_dir(self.checkpoint_root, inp.checkpoint_dir)
        present = self.running.get(inp.allocation_id)
        if present is not None and present.rank == inp.rank:
            # Launched again (its earlier activity stopped heartbeating: this agent restarted, or was stalled):
            # watch the member that runs, never start a second one.
            log.info("adopting the member of %s rank %d (allocation %s, pid %s)", inp.job_id, inp.rank, inp.allocation_id, present.pid)
            return await self._watched(present, inp, ckpt)
        if inp.adopt:
            raise ApplicationError(
                f"node {self.node_id} has no member of allocation {inp.allocation_id} rank {inp.rank} to adopt",
                type=MEMBER_GONE,
                non_retryable=True,
            )
        if self.stop_requests.pop(inp.allocation_id, None) is not None:
            return LaunchResult(exit_code=None, how="terminated", error="stopped before it started")
        # The lease starts when the activity started (the store held the allocation then: the workflow revokes
        # it only after this activity's end), read on this node's clock.
        started = activity.info().started_time.timestamp()
        lease_s = math.inf if self.lease_s is None else self.lease_s
        lease_until = first_lease_until(launched_at, lease_clock(), time.time() - started, lease_s)
        path.parent.mkdir(parents=True, exist_ok=True)
        container = f"fg-{inp.allocation_id}-r{inp.rank}" if self.runtime != "process" else ""
        uid, tmp = None, None
        if self.run_as is not None:
            uid = self.run_as.uid(inp.tenant, inp.job_id)
            clash = next((m for m in self.running.values() if m.uid == uid and m.tenant != inp.tenant), None)
            if clash is not None:
                error = f"tenants {clash.tenant!r} and {inp.tenant!r} map to one uid ({uid}); change FAIRGANG_JOB_UID_BASE"
                return LaunchResult(exit_code=127, how="start_failed", error=error)
            try:
                keep_private(path.parent)
                hand_over(ckpt, uid, self.run_as)
                if not container:  # a container has a tmpfs /tmp of its own
                    tmp = private_tmp(self.run_as, uid, inp.allocation_id, inp.rank)
            except OSError as err:
                return LaunchResult(exit_code=127, how="start_failed", error=f"could not prepare the member's directories: {err}")
        argv, env = self._command(inp, ckpt, container, uid, tmp)
        # Members run under the shim (worker_agent/shim.py), which SIGKILLs the member (process group, or
        # container by name) one grace period after SIGTERM even when this agent is gone; it tells us through
        # a pipe how the start went. Adoptable members hold their lease in a file (the next run of this agent
        # renews it), other ones through a pipe that closes with this agent.
        status_r, status_w = os.pipe()
        files = self._member_files(inp.allocation_id, inp.rank)
        keep_r, keep_w = os.pipe() if self.lease_s is not None and files is None else (-1, -1)
        if files is not None:  # the shim writes the exit file there, maybe before this agent records the member
            files[1].parent.mkdir(parents=True, exist_ok=True)
            files[1].unlink(missing_ok=True)
        cli = self.runtime if container else ""
        shim_uid = uid if not container else None  # a container's uid is the runtime's --user
        argv = [*shim_argv(inp.grace_period_s, status_w, keep_r, lease_until, cli, container, shim_uid, files), *argv]
        with open(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as out:
            try:
                ckpt.mkdir(parents=True, exist_ok=True)
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_term_with_agent,
                    pass_fds=tuple(fd for fd in (status_w, keep_r) if fd >= 0),
                )
            except OSError as err:
                out.write(f"fairgang: could not start {argv[0]!r}: {err}\n".encode())
                _close(status_r, keep_w)
                drop_private_tmp(tmp)
                return LaunchResult(exit_code=127, how="start_failed", error=str(err))
            finally:
                _close(status_w, keep_r)
        if keep_w >= 0:
            os.set_blocking(keep_w, False)
        member = RunningMember(
            inp.allocation_id, inp.job_id, inp.attempt, inp.rank, proc.pid, inp.grace_period_s, self.runtime, container, proc
        )
        member.gpu_indices, member.launched_at = list(inp.gpu_indices), launched_at
        member.lease_until, member.keepalive_fd = lease_until, keep_w
        member.tenant, member.uid = inp.tenant, uid
        member.checkpoint = read_latest_marker(ckpt, self._job_view(inp, ckpt))  # an earlier attempt's is not news
        self.running[inp.allocation_id] = member
        if self.stop_requests.pop(inp.allocation_id, None) is not None:
            member.stop.set()  # the stop came while the process was being started
        self._save_state(member)
        # Recorded: from now on the member outlives this agent within its lease (the shim sees the file).
        self._write_lease(member)
        member.watchers += 1
        handed_on = False
        try:
            job_pid = proc.pid
            if status_r >= 0:
                try:
                    status = await asyncio.to_thread(_read_status, status_r)
                except asyncio.CancelledError:
                    if self._hand_on(member):
                        handed_on = True
                        raise self._restarting() from None
                    await stop_member(member, heartbeat=activity.heartbeat)
                    raise
                if not status.startswith("ok "):
                    await proc.wait()
                    error = status.removeprefix("error ").strip() or f"the member's supervisor ended with {proc.returncode}"
                    return LaunchResult(exit_code=127, how="start_failed", error=error)
                job_pid = int(status.split()[1])
            member.started = True
            await self._signal(inp.job_id, "member_started", MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=job_pid))
            member.watchers -= 1
            handed_on = True  # _watched counts itself and cleans up
            return await self._watched(member, inp, ckpt, tmp)
        finally:
            if not handed_on:
                member.watchers -= 1
                self._forget(member)
                drop_private_tmp(tmp)

    async def _watched(self, member: RunningMember, inp: LaunchInput, ckpt: Path, tmp: Path | None = None) -> LaunchResult:
        """Watch a member to its end (one this activity started, or one it adopts), then forget it; unless this
        activity is cancelled because its agent stops or Temporal gave up on it: then the member runs on for
        another launch (of this agent's next run, or of this one) to adopt."""
        member.watchers += 1
        handed_on = False
        try:
            if member.proc is None and member.started:
                await self._signal(
                    inp.job_id, "member_started", MemberStarted(allocation_id=inp.allocation_id, rank=inp.rank, pid=member.pid)
                )
            return await self._watch(member, inp, ckpt)
        except asyncio.CancelledError:
            if self._hand_on(member):
                handed_on = True
                raise self._restarting() from None
            raise
        finally:
            member.watchers -= 1
            if not handed_on and member.watchers == 0:
                self._forget(member)
                drop_private_tmp(tmp)

    def _hand_on(self, member: RunningMember) -> bool:
        """Cancelled, but not by the workflow: the agent stops, or Temporal no longer knows this attempt (its
        heartbeats timed out, the workflow launched the member again). The member runs on (adoptable only)."""
        details = activity.cancellation_details()
        return self.adoptable and details is not None and not details.cancel_requested and member.allocation_id not in self.fenced

    def _restarting(self) -> BaseException:
        details = activity.cancellation_details()
        if details is not None and details.worker_shutdown:
            return ApplicationError("the agent is stopping; its member runs on for the next run to adopt", type=AGENT_RESTARTING)
        return asyncio.CancelledError()

    def _forget(self, member: RunningMember) -> None:
        if self.running.get(member.allocation_id) is member:
            del self.running[member.allocation_id]
        self._drop_state(member)
        # A shim whose keepalive pipe closes stops its member at once: nothing runs without its activity.
        _close(member.keepalive_fd)
        member.keepalive_fd = -1

    @activity.defn(name="stop")
    async def stop(self, inp: StopInput) -> StopResult:
        """Stop a member now (the workflow's cancel, preempt, max runtime, a failed or lost gang member).

        Idempotent: a repeat, or a stop for an attempt that already ended here, sends nothing.
        """
        outcome = self.request_stop(inp.allocation_id)
        log.info("stop of %s rank %d (allocation %s, %s): %s", inp.job_id, inp.rank, inp.allocation_id, inp.reason, outcome)
        return StopResult(outcome=outcome)

    def request_stop(self, allocation_id: str) -> str:
        """SIGTERM the allocation's member now; its launch activity waits out the grace period and SIGKILLs it."""
        member = self.running.get(allocation_id)
        if member is None:
            now = time.monotonic()
            for old in [a for a, t in self.stop_requests.items() if t < now - STOP_REQUEST_TTL_S]:
                del self.stop_requests[old]
            self.stop_requests[allocation_id] = now
            return "absent"
        if member.stop.is_set():
            return "stopping"
        member.stop.set()
        if member.started:
            terminate(member)
        return "signalled"

    def _command(
        self, inp: LaunchInput, ckpt: Path, container: str, uid: int | None = None, tmp: Path | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """What to exec, and with which environment, for this node's runtime.

        A container runs without capabilities or a way to gain privileges, on a read-only root with a private
        /tmp and its checkpoint directory as the only mount (as the tenant's uid where the node isolates)."""
        if self.runtime == "process":
            env = job_environment(inp, str(ckpt))
            if tmp is not None:
                env.update({"TMPDIR": str(tmp), "HOME": str(tmp)})
            return list(inp.argv), env
        job_env = job_environment(inp, inp.checkpoint_dir, base={})
        argv = [self.runtime, "run", "--rm", "--init", "--name", container, "--stop-timeout", str(max(1, round(inp.grace_period_s)))]
        argv += ["--cap-drop=ALL", "--security-opt=no-new-privileges", "--read-only", "--tmpfs=/tmp"]
        if uid is not None:
            argv += [f"--user={uid}:{uid}"]
        argv += ["--volume", f"{ckpt}:{inp.checkpoint_dir}"]
        for key, value in sorted(job_env.items()):
            argv += ["--env", f"{key}={value}"]
        if self.gpu_devices:
            argv += [a for i in inp.gpu_indices for a in ("--device", f"nvidia.com/gpu={i}")]
        cli_env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGANG_") and k != "DATABASE_URL"}
        return [*argv, inp.image, *inp.argv], cli_env

    async def _signal(self, job_id: str, name: str, arg: object) -> None:
        try:
            await activity.client().get_workflow_handle(job_id).signal(name, arg)
        except Exception as err:  # noqa: BLE001 - best effort: the workflow copes without it
            log.warning("signal %s to %s failed: %s", name, job_id, err)

    async def _report_checkpoint(self, inp: LaunchInput, ckpt: Path, seen: CheckpointsSeen) -> None:
        """Rank 0: report when the job's LATEST marker names another checkpoint (numbered in order), to the store
        (through ``report_checkpoint``; one that fails is tried again at the next look) or else to the workflow."""
        if inp.rank != 0:
            return
        latest = read_latest_marker(ckpt, self._job_view(inp, ckpt))
        if not latest or latest == seen.path:
            return
        report = CheckpointReport(allocation_id=inp.allocation_id, attempt=inp.attempt, path=latest, seq=seen.reports + 1)
        if self.report_checkpoint is not None:
            if not await self.report_checkpoint(report):
                return
        else:
            await self._signal(inp.job_id, "checkpoint", report)
        seen.path, seen.reports = latest, report.seq
        member = self.running.get(inp.allocation_id)
        if member is not None:  # an adopting launch goes on from here
            member.checkpoint, member.reports = seen.path, seen.reports
            self._save_state(member)

    def _job_view(self, inp: LaunchInput, ckpt: Path) -> str:
        return str(ckpt) if self.runtime == "process" else inp.checkpoint_dir

    async def _watch(self, member: RunningMember, inp: LaunchInput, ckpt: Path) -> LaunchResult:
        proc = member.proc
        reported = CheckpointsSeen(member.checkpoint, member.reports)
        exited = asyncio.ensure_future(proc.wait() if proc is not None else self._gone(member))
        stop_asked = asyncio.ensure_future(member.stop.wait())
        try:
            while True:
                activity.heartbeat()
                await self._report_checkpoint(inp, ckpt, reported)
                if member.stop.is_set():
                    # A stop activity: SIGTERM (unless it sent it), the grace period from that SIGTERM, SIGKILL.
                    code = await stop_member(member, heartbeat=activity.heartbeat, exit_status=self.exit_status)
                    await self._report_checkpoint(inp, ckpt, reported)
                    return LaunchResult(exit_code=code, how="terminated", checkpoint=reported.path or None)
                await asyncio.wait((exited, stop_asked), timeout=HEARTBEAT_EVERY_S, return_when=asyncio.FIRST_COMPLETED)
                if member.stop.is_set() or not exited.done():
                    continue  # stopped (it may have exited of the SIGTERM already): "terminated", above
                code = exited.result()
                await self._report_checkpoint(inp, ckpt, reported)
                fenced = inp.allocation_id in self.fenced or self.shim_fenced(member)
                if ended_fenced(fenced, -9 if code is None else code, member.lease_until, lease_clock()):
                    raise ApplicationError(
                        "the agent fenced this member (its allocation is no longer held, or its lease ran out)",
                        type=MEMBER_FENCED,
                        non_retryable=True,
                    )
                if code is None:  # an adopted member's shim vanished without its exit status
                    raise ApplicationError("the member's supervisor ended without its exit status", type=MEMBER_GONE, non_retryable=True)
                return LaunchResult(exit_code=code, how="exited", checkpoint=reported.path or None)
        except asyncio.CancelledError:
            if self._hand_on(member):
                raise  # the member runs on (see _watched)
            await stop_member(member, heartbeat=activity.heartbeat, exit_status=self.exit_status)
            await self._report_checkpoint(inp, ckpt, reported)
            raise
        finally:
            stop_asked.cancel()
            exited.cancel()

    # ------------------------------------------------------------ state kept across agent restarts

    def _state_file(self, member: RunningMember) -> Path | None:
        if self.state_dir is None:
            return None
        return self.state_dir / f"{member.allocation_id}-rank-{member.rank}.json"

    def _save_state(self, member: RunningMember) -> None:
        path = self._state_file(member)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {k: v for k, v in vars(member).items() if k not in _LOCAL_FIELDS}
        data["start_time"] = process_start_time(member.pid)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)

    def _drop_state(self, member: RunningMember) -> None:
        path = self._state_file(member)
        if path is not None:
            path.unlink(missing_ok=True)
        files = self._member_files(member.allocation_id, member.rank)
        for file in files or ():
            file.unlink(missing_ok=True)

    def _member_files(self, allocation_id: str, rank: int) -> tuple[Path, Path] | None:
        """An adoptable member's lease file (the agent writes it, the shim reads it) and exit file (the other way)."""
        if not self.adoptable:
            return None
        assert self.state_dir is not None
        stem = self.state_dir / f"{allocation_id}-rank-{rank}"
        return stem.with_suffix(".lease"), stem.with_suffix(".exit")

    def _write_lease(self, member: RunningMember) -> None:
        files = self._member_files(member.allocation_id, member.rank)
        if files is None:
            return
        tmp = files[0].with_suffix(".lease-tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(f"{member.lease_until:.6f}\n")
            tmp.replace(files[0])

    def _member_file(self, member: RunningMember, which: int) -> list[str]:
        """The words of an adoptable member's lease file (0) or exit file (1); none when it is absent."""
        files = self._member_files(member.allocation_id, member.rank)
        if files is None:
            return []
        try:
            return files[which].read_text().split()
        except OSError:
            return []

    def exit_status(self, member: RunningMember) -> int | None:
        """An adopted member's exit status, as its shim wrote it (None: not written)."""
        words = self._member_file(member, 1)
        try:
            return int(words[0])
        except (IndexError, ValueError):
            return None

    def shim_fenced(self, member: RunningMember) -> bool:
        """Did an adoptable member's shim stop it on its own (its lease ran out)? Then its end is the fencing's,
        whatever lease this agent believes it renewed meanwhile."""
        return self._member_file(member, 1)[1:2] == ["fenced"]

    def _lease_written(self, member: RunningMember) -> float:
        """The lease last written to an adoptable member's lease file: the one its shim holds (-inf: none)."""
        try:
            return float(self._member_file(member, 0)[0])
        except (IndexError, ValueError):
            return -math.inf

    async def _gone(self, member: RunningMember) -> int | None:
        """Wait for an adopted member's shim to end; its exit status (None: unknown)."""
        while pid_alive(member.pid):
            await asyncio.sleep(0.2)
        return self.exit_status(member)

    def orphans(self) -> list[RunningMember]:
        """Members a previous run of this agent started that are still alive, and (adoptable ones) those that
        ended while no agent ran (their exit status is in their exit file)."""
        if self.state_dir is None or not self.state_dir.exists():
            return []
        found = []
        for path in sorted(self.state_dir.glob("*.json")):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                path.unlink(missing_ok=True)
                continue
            start = data.pop("start_time", None)
            alive = start is not None and process_start_time(data["pid"]) == start
            member = RunningMember(**data)
            member.started = True
            # The state file keeps the lease of the member's launch; renewals went to its lease file.
            member.lease_until = max(member.lease_until, self._lease_written(member))
            if alive or data.get("container") or (self.adoptable and self.exit_status(member) is not None):
                found.append(member)
            else:
                self._drop_state(member)
        return found

    def adopt(self, member: RunningMember) -> None:
        """Take over a member a previous run of this agent left running (its allocation is still held): its
        lease is renewed from now on, and its launch, when it comes again, watches it."""
        log.info(
            "keeping the member of %s rank %d (allocation %s, pid %s) for its launch",
            member.job_id,
            member.rank,
            member.allocation_id,
            member.pid,
        )
        self.running[member.allocation_id] = member

    async def release_unwatched(self, member: RunningMember) -> None:
        """A member no launch watches any more (its workflow gave it up) whose allocation is gone: stop it, forget it."""
        if member.watchers:
            return
        await stop_member(member, exit_status=self.exit_status)
        if member.watchers == 0:
            self._forget(member)

    async def stop_orphan(self, member: RunningMember) -> None:
        """Stop a member a previous agent left whose allocation the store no longer holds: SIGTERM, grace, SIGKILL."""
        log.warning("stopping orphaned member of %s (allocation %s, pid %s)", member.job_id, member.allocation_id, member.pid)
        await stop_member(member, exit_status=self.exit_status)
        self._drop_state(member)

    def renew(self, live: list[str], asked_at: float) -> None:
        """A heartbeat sent at ``asked_at`` (lease_clock()) was answered holding ``live``: extend those members' leases."""
        if self.lease_s is None:
            return
        for allocation_id in live:
            member = self.running.get(allocation_id)
            if member is None or allocation_id in self.fenced:
                continue
            until = renewed_lease_until(member.lease_until, asked_at, self.lease_s, lease_clock())
            if until is None:
                continue
            member.lease_until = until
            if member.keepalive_fd >= 0:
                with contextlib.suppress(OSError):  # a full pipe (the shim is busy) or a shim already gone
                    os.write(member.keepalive_fd, f"{until:.6f}\n".encode())
            self._write_lease(member)

    def expired(self, now: float) -> list[RunningMember]:
        """Members whose lease ran out and that the agent has not fenced yet."""
        return [m for a, m in sorted(self.running.items()) if lease_expired(m.lease_until, now) and a not in self.fenced]

    def kill(self, allocation_id: str) -> None:
        """Fence: SIGKILL the member of an allocation the store no longer holds."""
        member = self.running.get(allocation_id)
        if member is None:
            return
        self.fenced.add(allocation_id)
        if member.container:
            subprocess.Popen([member.runtime, "kill", member.container], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(member.pid, signal.SIGKILL)


SHIM = Path(__file__).resolve().parents[1] / "worker_agent" / "shim.py"


def shim_argv(
    grace_s: float,
    status_fd: int,
    keepalive_fd: int = -1,
    lease_until: float = math.inf,
    cli: str = "",
    container: str = "",
    uid: int | None = None,
    files: tuple[Path, Path] | None = None,
) -> list[str]:
    """The command line that runs a member under the shim (isolated: the job's PYTHON* variables do not reach it).

    With ``cli`` and ``container`` the member is ``<cli> run --name <container> ...`` and the shim stops it by name.
    With ``files`` (an adoptable member's lease file and exit file) the lease is read from the first, not a pipe.
    """
    opts = ["--grace", repr(float(grace_s)), "--parent", str(os.getpid()), "--status-fd", str(status_fd)]
    if keepalive_fd >= 0:
        opts += ["--keepalive-fd", str(keepalive_fd), "--lease-until", f"{lease_until:.6f}"]
    if files is not None:
        opts += ["--lease-file", str(files[0]), "--lease-until", f"{lease_until:.6f}", "--exit-file", str(files[1])]
    if container:
        opts += ["--container-cli", cli, "--container", container]
    if uid is not None:
        opts += ["--uid", str(uid)]
    return [sys.executable, "-I", str(SHIM), *opts, "--"]


def _read_status(fd: int) -> str:
    """The shim's one line (``ok <pid>`` or ``error <why>``); empty when it died first."""
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _close(*fds: int) -> None:
    for fd in fds:
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


def _term_with_agent() -> None:
    """In the child: SIGTERM it when the agent dies, so that a member never outlives its activity.

    The child is the shim, which replaces this with its own signal and then stops the member
    itself (SIGTERM, grace, SIGKILL: to its process group, or to its container by name; see
    ``worker_agent/shim.py``). An agent that comes back stops whatever is left (see
    :meth:`LaunchActivities.stop_orphan`).
    """
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a pid apart from its reuse)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def terminate(member: RunningMember) -> None:
    """SIGTERM the member's process group, once: its grace period counts from this first SIGTERM."""
    if member.term_at is not None:
        return
    member.term_at = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(member.pid, signal.SIGTERM)


async def _remove_container(member: RunningMember) -> None:
    """SIGKILL and remove the member's container by name (whatever its shim could not stop or left behind)."""
    for words in (("kill", "--signal", "KILL"), ("rm", "-f")):
        cleanup = await asyncio.create_subprocess_exec(
            member.runtime, *words, member.container, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        await cleanup.wait()


async def stop_member(
    member: RunningMember, heartbeat: Callable[[], None] | None = None, exit_status: Callable[[RunningMember], int | None] | None = None
) -> int | None:
    """SIGTERM (once), the member's grace period from that SIGTERM (heartbeating), then SIGKILL: a process
    group or a container. Its exit status, when this process started it (or, for one it did not, what
    ``exit_status`` finds). Safe to call again (a cancel that comes while a stop activity's stop is under way):
    nothing is sent twice and the grace period does not start over."""
    if member.proc is None:
        # A member this process did not start (adopted, or left by a previous run of the agent): SIGTERM to its
        # shim's group (the shim stops a container by name), the grace period from then, SIGKILL.
        terminate(member)
        deadline = (member.term_at or time.monotonic()) + member.grace_period_s + (CONTAINER_STOP_MARGIN_S if member.container else 0.0)
        while pid_alive(member.pid) and time.monotonic() < deadline:
            if heartbeat is not None:
                heartbeat()
            await asyncio.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(member.pid, signal.SIGKILL)
        if member.container:  # whatever a shim that died too left of it
            await _remove_container(member)
        return exit_status(member) if exit_status is not None else None
    if member.container:
        # Our shim runs the container: SIGTERM to its group, and it stops the container by name (SIGTERM once,
        # the grace period, SIGKILL) and ends with `run`'s status. The margin is for the CLI's own time.
        terminate(member)
        grace = member.grace_period_s + CONTAINER_STOP_MARGIN_S
        code = await stop_process_group(member.proc, grace, heartbeat, signalled_at=member.term_at)
        await _remove_container(member)  # in case the shim could not finish
        return code
    terminate(member)
    return await stop_process_group(member.proc, member.grace_period_s, heartbeat, signalled_at=member.term_at)


async def stop_process_group(
    proc: asyncio.subprocess.Process, grace_s: float, heartbeat: Callable[[], None] | None = None, signalled_at: float | None = None
) -> int:
    """SIGTERM the process group, wait up to ``grace_s`` after that SIGTERM (heartbeating), then SIGKILL it.

    With ``signalled_at`` (time.monotonic()) the group got its SIGTERM then: none is sent, the grace period
    counts from then.
    """
    if signalled_at is None:
        signalled_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = signalled_at + grace_s
    while proc.returncode is None and time.monotonic() < deadline:
        if heartbeat is not None:
            heartbeat()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(proc.wait()), min(HEARTBEAT_EVERY_S, max(deadline - time.monotonic(), 0.01)))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return await proc.wait()
