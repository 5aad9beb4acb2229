"""The member supervisor: a small process between the agent and each member's process or container.

``python -m worker_agent.shim --grace S --parent PID --status-fd FD [--keepalive-fd K --lease-until T]
[--lease-file F --lease-until T --exit-file E] [--container-cli CLI --container NAME] [--uid U] -- ARGV...``

With ``--uid U`` (a shim started by root) the member runs as uid and gid ``U`` with no supplementary
groups (worker_agent/isolation.py); the shim stays root, so the member cannot signal it.

The agent starts it as the leader of a new process group; the shim starts ARGV in that same
group, so everything the member starts is in it too. It exists so that a member's stop ends
in SIGKILL even when the agent cannot send it:

* The agent stops a member by sending SIGTERM to the whole group; the shim gets it too and,
  if the group is still there ``S`` seconds later, SIGKILLs it (the agent does the same).
* When the agent dies (kill -9, crash), the kernel sends the shim ``SIGUSR1``
  (``PR_SET_PDEATHSIG``). The shim then sends SIGTERM to the group itself and SIGKILLs it
  after ``S`` seconds. So a member that ignores SIGTERM still ends one grace period after its
  agent died, and the workflow, which waits longer than that before it queues the job again,
  never runs two attempts at once.
* The member's lease: with ``--keepalive-fd``, the agent writes a new deadline (a :func:`lease_clock`
  time, one per line) into that pipe each time a heartbeat answer shows the store still holds the
  member's allocation; the deadline is the time that heartbeat was *sent* plus the agent's
  ``self_fence_after_s``, and ``T`` is the first one. When the deadline passes with no later one (the
  agent is frozen, cut off from the API, told the allocation is gone, or hung), or the pipe is closed
  (the agent died, or its launch activity ended), the shim stops the member the same way: SIGTERM to
  the group, SIGKILL ``S`` seconds later. So a member is gone ``self_fence_after_s + S`` after the last
  moment the store held its allocation, which is what the workflow waits for after it revokes an
  allocation whose members' end it could not confirm (workflows/job.py).
* Adoptable members (``--lease-file``, an agent with a state dir): the lease is read from that file
  instead of a pipe. Until the file first appears the shim ends with its agent as above (the agent dies
  before it recorded the member); from then on it does not: an agent that restarts (kill -9, an upgrade, a
  restart of the whole platform) finds the member in its state dir and adopts it, renewing the same file,
  and if none does within the lease, the lease runs out and the member is stopped as above. The member's
  exit status also goes to ``--exit-file``, for an agent that did not start this shim.
* If the shim itself dies, the member gets SIGKILL (its own ``PR_SET_PDEATHSIG``).

Containers (``--container-cli podman --container NAME``; ARGV is ``podman run --rm --name NAME ...``):
the container itself runs under conmon, outside any group of ours, so every stop above goes to it by
name instead: ``CLI kill --signal TERM NAME`` (once per stop, however many reasons to stop arrive), then
after ``S`` seconds ``CLI kill --signal KILL NAME``, and once the ``run`` client has ended, ``CLI kill``
and ``CLI rm -f`` again for whatever a client killed mid-start may have left. The ``run`` client gets
its own session, so the SIGTERM the agent sends to the shim's group does not reach it (its
``--sig-proxy`` would pass that on to the container a second time); its exit status is the member's.

It tells the agent through ``FD`` either ``ok <pid>`` (the member's pid) or ``error <why>`` (the
member could not start; exit status 127). Its exit status is the member's (a member killed by
a signal makes the shim die of that signal). It imports nothing but the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
#: The signal the kernel sends the shim when the agent dies.
AGENT_DIED = signal.SIGUSR1
POLL_S = 0.05
#: How long the shim waits for one container CLI command (``kill``, ``rm``).
CLI_TIMEOUT_S = 30.0
#: How long it waits for a container's ``run`` client to end once the container got SIGKILL.
CLIENT_AFTER_KILL_S = 5.0


def lease_clock() -> float:
    """The clock of member leases (agent and shim): it runs through a suspend of the machine, so a lease
    never outlives one."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _prctl_pdeathsig(sig: int) -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))


def _kill_with_shim() -> None:
    """In the member: SIGKILL it if the shim dies."""
    _prctl_pdeathsig(signal.SIGKILL)


def _die_like(code: int) -> int:
    """Exit as the member did: with its status, or of its signal."""
    if code >= 0:
        return code
    sig = -code
    with contextlib.suppress(OSError, ValueError):
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1.0)
    return 128 + sig


def _container_cmd(cli: str, *words: str) -> subprocess.Popen[bytes]:
    """``CLI WORDS...`` in a session of its own, its output discarded."""
    devnull = subprocess.DEVNULL
    return subprocess.Popen([cli, *words], stdin=devnull, stdout=devnull, stderr=devnull, start_new_session=True)


def _run_container_cmd(cli: str, *words: str) -> None:
    with contextlib.suppress(OSError):
        helper = _container_cmd(cli, *words)
        try:
            helper.wait(CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            helper.kill()
            helper.wait()


def _kill_container(cli: str, container: str, client: subprocess.Popen[bytes]) -> int:
    """The end of the grace period: SIGKILL the container, then wait for its ``run`` client (SIGKILL it
    too if it does not end: one still starting the container; the caller then removes what it left); its
    exit status."""
    _run_container_cmd(cli, "kill", "--signal", "KILL", container)
    try:
        return client.wait(CLIENT_AFTER_KILL_S)
    except subprocess.TimeoutExpired:
        client.kill()
        return client.wait()


def _remove_container(cli: str, container: str) -> None:
    """Make sure the container is gone (a client killed while it started one may have left it running)."""
    _run_container_cmd(cli, "kill", "--signal", "KILL", container)
    _run_container_cmd(cli, "rm", "-f", container)


def main(args: list[str]) -> int:
    sep = args.index("--")
    opts, argv = dict(zip(args[:sep:2], args[1:sep:2], strict=True)), args[sep + 1 :]
    grace, parent, status_fd = float(opts["--grace"]), int(opts["--parent"]), int(opts["--status-fd"])
    keepalive = int(opts.get("--keepalive-fd", "-1"))
    # Adoptable members: the lease lives in a file the agent (or the next run of the agent) rewrites, and the
    # exit status goes to a file that the next run of the agent reads when this shim ended while none ran.
    lease_file, exit_file = opts.get("--lease-file", ""), opts.get("--exit-file", "")
    lease_seen = 0
    cli, container = opts.get("--container-cli", ""), opts.get("--container", "")
    uid = int(opts["--uid"]) if "--uid" in opts else None
    as_uid: dict[str, object] = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    term_sent = False
    lease_until = float(opts.get("--lease-until", "inf")) if keepalive >= 0 or lease_file else math.inf
    detached = False
    group = os.getpgid(0)
    stop_at: float | None = None
    fenced = False
    pending = b""

    def on_term(_sig: int, _frame: object) -> None:
        # The agent (or this shim, below) sent the whole group SIGTERM: the grace period starts.
        nonlocal stop_at
        if stop_at is None:
            stop_at = time.monotonic() + grace

    def stop_on_own() -> None:
        nonlocal fenced
        if fenced:
            return
        fenced = True
        on_term(signal.SIGTERM, None)
        if not container:  # a container gets its SIGTERM from the main loop (send_term)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)

    def on_agent_died(_sig: int, _frame: object) -> None:
        if not detached:  # a recorded adoptable member outlives its agent: its lease alone bounds it
            stop_on_own()

    def fence(why: str) -> None:
        if not fenced:
            print(f"fairgang: {why}: stopping the member (SIGTERM, then SIGKILL after {grace:g}s)", flush=True)
            stop_on_own()

    def read_keepalive() -> None:
        nonlocal keepalive, lease_until, pending
        if not select.select([keepalive], [], [], POLL_S)[0]:
            return
        try:
            chunk = os.read(keepalive, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            os.close(keepalive)
            keepalive = -1
            fence("the agent closed the member's keepalive pipe (it died, or its launch activity ended)")
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                lease_until = max(lease_until, float(line))

    def read_lease_file() -> None:
        # The agent writes the file (atomically) once it has recorded the member, and then with each renewal.
        # From its first appearance the member no longer ends with its agent: a new run of the agent adopts it
        # within the lease, or the lease runs out.
        nonlocal lease_until, lease_seen, detached
        try:
            stamp = os.stat(lease_file).st_mtime_ns
        except OSError:
            return
        if stamp == lease_seen:
            return
        lease_seen = stamp
        with contextlib.suppress(OSError, ValueError), open(lease_file) as f:
            lease_until = max(lease_until, float(f.read().strip() or "0"))
        if not detached:
            detached = True
            _prctl_pdeathsig(0)

    def send_term() -> None:
        # The container's SIGTERM, once: not from a signal handler (it starts a process), and in a session of
        # its own, so that a SIGKILL of the shim's group does not cut it short.
        nonlocal term_sent
        if container and stop_at is not None and not term_sent:
            term_sent = True
            with contextlib.suppress(OSError):
                _container_cmd(cli, "kill", "--signal", "TERM", container)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(AGENT_DIED, on_agent_died)
    _prctl_pdeathsig(AGENT_DIED)
    try:
        # The shim has one thread: preexec_fn is safe. A container's `run` client gets a session of its own.
        # The uid changes before preexec_fn runs, so the parent-death signal it sets is kept.
        proc = subprocess.Popen(argv, preexec_fn=_kill_with_shim, start_new_session=bool(container), **as_uid)  # type: ignore[call-overload]
    except OSError as err:
        print(f"fairgang: could not start {argv[0]!r}: {err}", flush=True)
        os.write(status_fd, f"error {err}\n".encode())
        os.close(status_fd)
        return 127
    os.write(status_fd, f"ok {proc.pid}\n".encode())
    os.close(status_fd)
    if os.getppid() != parent:  # the agent died before the shim could hear of it
        on_agent_died(AGENT_DIED, None)
    while True:
        if lease_file:
            read_lease_file()
        if keepalive >= 0:
            read_keepalive()
            code = proc.poll()
        else:
            try:
                code = proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                code = None
        if code is not None:
            break
        if not fenced and lease_clock() >= lease_until:
            fence("no keepalive from the agent before the member's lease ran out")
        send_term()
        if stop_at is not None and time.monotonic() >= stop_at:
            if not container:
                os.killpg(group, signal.SIGKILL)  # the shim goes too
                continue
            code = _kill_container(cli, container, proc)
            break
    if container:
        if stop_at is not None or code < 0:
            # Stopped, or its client died of a signal: whatever it started must not outlive it.
            _remove_container(cli, container)
        _write_exit(exit_file, code, fenced)
        return _die_like(code)
    _write_exit(exit_file, code, fenced)
    if stop_at is not None and (fenced or os.getppid() != parent):
        # Stopped on its own, without its agent: nothing of the member may outlive the grace period.
        os.killpg(group, signal.SIGKILL)
    return _die_like(code)


def _write_exit(path: str, code: int, fenced: bool) -> None:
    """The member's exit status (negative: the signal that killed it), for an agent that did not start this shim;
    followed by ``fenced`` when the shim stopped it on its own (its lease ran out, or its agent went first)."""
    if not path:
        return
    with contextlib.suppress(OSError):
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{code} fenced\n" if fenced else f"{code}\n")
        os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
