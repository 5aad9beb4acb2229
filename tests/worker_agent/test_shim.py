"""The member supervisor (worker_agent/shim.py) on real processes and signals.

The "agent" here is a forked child of the test that starts the shim as the launch activity does
(new session, PR_SET_PDEATHSIG, the status pipe) and then dies or stops the member.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities.launch import _read_status, _term_with_agent, pid_alive, shim_argv, stop_process_group
from worker_agent.shim import lease_clock

#: A member that ignores SIGTERM and has a child that exits on SIGTERM (writing a marker first).
MEMBER = """
import os, signal, subprocess, sys, time
d = sys.argv[1]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: (open(sys.argv[1] + '/child.term', 'w').close(), sys.exit(0)))"
child += "; open(sys.argv[1] + '/child.ready', 'w').close(); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", child, d])
while not os.path.exists(d + "/child.ready"):
    time.sleep(0.01)
open(d + "/member.pid", "w").write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


#: Process groups the tests started: killed at the end even when a test fails.
_groups: list[int] = []


@pytest.fixture(autouse=True)
def _kill_leftovers() -> Iterator[None]:
    yield
    for group in _groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
    _groups.clear()


def _wait(predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def _start_under_shim(argv: list[str], grace: float) -> tuple[subprocess.Popen[bytes], str]:
    r, w = os.pipe()
    proc = subprocess.Popen([*shim_argv(grace, w), *argv], start_new_session=True, preexec_fn=_term_with_agent, pass_fds=(w,))
    os.close(w)
    _groups.append(proc.pid)
    return proc, _read_status(r)


def test_a_dead_agents_member_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    grace = 2.0
    agent = os.fork()
    if agent == 0:  # the "agent": start the member under the shim, then die without stopping it
        try:
            _start_under_shim([sys.executable, "-c", MEMBER, str(tmp_path)], grace)
            while not (tmp_path / "member.pid").exists():
                time.sleep(0.01)
        finally:
            os._exit(0)
    os.waitpid(agent, 0)
    died_at = time.monotonic()
    member = int((tmp_path / "member.pid").read_text())
    _groups.append(os.getpgid(member))
    _wait(lambda: (tmp_path / "child.term").exists())  # the shim sent the whole group SIGTERM
    assert pid_alive(member)
    _wait(lambda: not pid_alive(member), timeout=grace + 30)
    assert time.monotonic() - died_at >= grace - 0.2, "killed before its grace period was over"


def test_the_agents_stop_reaches_the_group_and_the_member_exit_status_comes_through(tmp_path: Path) -> None:
    proc, status = _start_under_shim([sys.executable, "-c", MEMBER, str(tmp_path)], grace=1.0)
    assert status.startswith("ok ")
    member = int(status.split()[1])
    _wait(lambda: (tmp_path / "member.pid").exists())
    assert int((tmp_path / "member.pid").read_text()) == member
    os.killpg(proc.pid, signal.SIGTERM)  # what the agent's stop sends
    _wait(lambda: (tmp_path / "child.term").exists())
    _wait(lambda: proc.poll() is not None, timeout=30)  # the shim SIGKILLed the group after 1 s
    _wait(lambda: not pid_alive(member), timeout=10)  # the group's SIGKILL may reach the shim first
    for code, expected in (("import sys; sys.exit(5)", 5), ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", -11)):
        proc, status = _start_under_shim([sys.executable, "-c", code], grace=1.0)
        assert status.startswith("ok ") and proc.wait(30) == expected


def test_a_member_that_cannot_start_is_reported(tmp_path: Path) -> None:
    proc, status = _start_under_shim(["/nonexistent/train"], grace=1.0)
    assert status.startswith("error ") and "No such file" in status
    assert proc.wait(30) == 127


async def test_stop_process_group_through_the_shim_waits_the_grace_then_kills(tmp_path: Path) -> None:
    r, w = os.pipe()
    argv = [*shim_argv(1.5, w), sys.executable, "-c", MEMBER, str(tmp_path)]
    proc = await asyncio.create_subprocess_exec(*argv, start_new_session=True, pass_fds=(w,))
    os.close(w)
    _groups.append(proc.pid)
    member = int((await asyncio.to_thread(_read_status, r)).split()[1])
    while not (tmp_path / "member.pid").exists():
        await asyncio.sleep(0.02)
    beats: list[float] = []
    started = time.monotonic()
    await stop_process_group(proc, 1.5, heartbeat=lambda: beats.append(time.monotonic()))
    assert time.monotonic() - started >= 1.0 and not pid_alive(member)
    assert (tmp_path / "child.term").exists() and len(beats) >= 2


def test_a_live_agent_that_stops_renewing_the_lease_gets_its_member_killed(tmp_path: Path) -> None:
    """The agent lives on (frozen, or cut off from the control plane) but stops renewing: the shim fences."""
    lease, grace = 1.0, 1.0
    status_r, status_w = os.pipe()
    keep_r, keep_w = os.pipe()
    argv = [*shim_argv(grace, status_w, keep_r, lease_clock() + lease), sys.executable, "-c", MEMBER, str(tmp_path)]
    proc = subprocess.Popen(argv, start_new_session=True, pass_fds=(status_w, keep_r), stdout=subprocess.PIPE)
    os.close(status_w)
    os.close(keep_r)
    _groups.append(proc.pid)
    member = int(_read_status(status_r).split()[1])
    # Renewed for three leases' time: the member runs on.
    renewed_until = time.monotonic() + 3 * lease
    while time.monotonic() < renewed_until:
        os.write(keep_w, f"{lease_clock() + lease:.6f}\n".encode())
        assert pid_alive(member) and not (tmp_path / "child.term").exists()
        time.sleep(lease / 5)
    # Renewals stop (the pipe stays open: the agent is alive): SIGTERM when the lease runs out, SIGKILL a grace later.
    stopped_at = time.monotonic()
    _wait(lambda: (tmp_path / "child.term").exists(), timeout=30)
    _wait(lambda: proc.poll() is not None, timeout=30)
    _wait(lambda: not pid_alive(member), timeout=10)  # the group's SIGKILL may reach the shim first
    assert time.monotonic() - stopped_at >= grace, "killed before the grace period was over"
    assert proc.stdout is not None and b"no keepalive from the agent" in proc.stdout.read()
    os.close(keep_w)


def test_a_closed_keepalive_pipe_stops_the_member_at_once(tmp_path: Path) -> None:
    status_r, status_w = os.pipe()
    keep_r, keep_w = os.pipe()
    argv = [*shim_argv(1.0, status_w, keep_r, lease_clock() + 3600), sys.executable, "-c", MEMBER, str(tmp_path)]
    proc = subprocess.Popen(argv, start_new_session=True, pass_fds=(status_w, keep_r))
    os.close(status_w)
    os.close(keep_r)
    _groups.append(proc.pid)
    member = int(_read_status(status_r).split()[1])
    _wait(lambda: (tmp_path / "member.pid").exists())
    os.close(keep_w)  # the launch activity ended (or the agent died) with the member still running
    _wait(lambda: proc.poll() is not None, timeout=30)
    _wait(lambda: not pid_alive(member), timeout=10)  # the group's SIGKILL may reach the shim first
