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
    assert not pid_alive(member)
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
