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

from tests.worker_agent.test_stop import until
from worker_agent.launch import RunningMember, _read_status, _term_with_agent, pid_alive, shim_argv, stop_member, stop_process_group
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
    assert time.monotonic() - started >= 1.0
    await until(lambda: not pid_alive(member))  # SIGKILLed with its group; gone once it has been reaped
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


#: A stand-in for the podman CLI, for the shim's container stop: ``run --name N ... -- ARGV`` starts ARGV in a
#: session of its own (as conmon does: outside the shim's group, untouched when the client dies), passes the
#: SIGTERM it gets on to it (podman's --sig-proxy) and exits with its status (128 + signal when killed);
#: ``kill --signal SIG N`` and ``rm -f N`` signal it by name. It logs each command to ``<dir>/cli.log``.
FAKE_CLI = """
import os, signal, subprocess, sys
d, (cmd, *args) = os.path.dirname(os.path.abspath(__file__)), sys.argv[1:]
with open(os.path.join(d, "cli.log"), "a") as log:
    log.write(" ".join([cmd, *args]) + "\\n")
name = args[args.index("--name") + 1] if cmd == "run" else args[-1]
pidfile = os.path.join(d, name + ".pid")
if cmd == "run":
    box = subprocess.Popen(args[args.index("--") + 1 :], start_new_session=True)
    open(pidfile, "w").write(str(box.pid))
    signal.signal(signal.SIGTERM, lambda *_: box.send_signal(signal.SIGTERM))
    code = box.wait()
    os.unlink(pidfile)
    sys.exit(128 - code if code < 0 else code)
try:
    pid = int(open(pidfile).read())
except OSError:
    sys.exit(125)  # no such container
os.kill(pid, signal.SIGKILL if cmd == "rm" else getattr(signal, "SIG" + args[args.index("--signal") + 1]))
"""

#: The container's payload: counts the SIGTERMs it gets in ``<dir>/terms``; ignores them, or exits 3 on one.
BOX = """
import os, signal, sys, time
d, on_term = sys.argv[1], sys.argv[2]
def term(*_):
    open(d + "/terms", "a").write("TERM\\n")
    if on_term == "exit":
        time.sleep(0.3)  # a second SIGTERM would land here
        sys.exit(3)
signal.signal(signal.SIGTERM, term)
open(d + "/box.pid", "w").write(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def _fake_container(tmp_path: Path, name: str, on_term: str) -> tuple[str, list[str]]:
    cli = tmp_path / "fakecli"
    cli.write_text(f"#!{sys.executable}\n{FAKE_CLI}")
    cli.chmod(0o755)
    return str(cli), [str(cli), "run", "--rm", "--name", name, "--", sys.executable, "-c", BOX, str(tmp_path), on_term]


def _box_pid(tmp_path: Path) -> int:
    _wait(lambda: (tmp_path / "box.pid").exists() and (tmp_path / "box.pid").read_text())
    pid = int((tmp_path / "box.pid").read_text())
    _groups.append(pid)  # its own session: killed at the end even when a test fails
    return pid


@pytest.mark.parametrize("how", ["agent dies", "lease runs out"])
def test_a_container_that_ignores_sigterm_is_killed_by_name_one_grace_period_after_its_agent_is_gone(tmp_path: Path, how: str) -> None:
    """The container runs outside the shim's group (under conmon): the shim stops it through the CLI."""
    grace, lease = 2.0, 3.0 if how == "lease runs out" else 3600.0
    cli, argv = _fake_container(tmp_path, "fg-a-r0", "ignore")
    agent = os.fork()
    if agent == 0:  # the "agent": start the container under the shim, then die, or stop renewing its lease
        try:
            status_r, status_w = os.pipe()
            keep_r, _keep_w = os.pipe()  # stays open while the agent lives
            shim = [*shim_argv(grace, status_w, keep_r, lease_clock() + lease, cli, "fg-a-r0"), *argv]
            log = open(tmp_path / "shim.log", "wb")  # noqa: SIM115 - the agent's child keeps it
            subprocess.Popen(shim, start_new_session=True, preexec_fn=_term_with_agent, pass_fds=(status_w, keep_r), stdout=log)
            os.close(status_w)
            os.close(keep_r)
            _read_status(status_r)
            while not (tmp_path / "box.pid").exists():
                time.sleep(0.01)
            while how == "lease runs out":  # alive, keepalive pipe open, renewing nothing: frozen
                time.sleep(1)
        finally:
            os._exit(0)
    try:
        box = _box_pid(tmp_path)
        if how == "agent dies":
            os.waitpid(agent, 0)
        gone_from = time.monotonic()
        _wait(lambda: (tmp_path / "terms").exists(), timeout=30)  # SIGTERM, through the CLI
        stopped_at = time.monotonic()
        assert pid_alive(box)
        _wait(lambda: not pid_alive(box), timeout=grace + 30)
        assert time.monotonic() - stopped_at >= grace - 0.3, "killed before its grace period was over"
        assert time.monotonic() - gone_from >= grace - 0.3
        _wait(lambda: not (tmp_path / "fg-a-r0.pid").exists(), timeout=30)  # its `run` client ended too
        assert (tmp_path / "terms").read_text() == "TERM\n", "the container got SIGTERM more than once"
        commands = (tmp_path / "cli.log").read_text()
        assert "kill --signal TERM fg-a-r0" in commands and "kill --signal KILL fg-a-r0" in commands, commands
        if how == "lease runs out":
            assert b"no keepalive from the agent" in (tmp_path / "shim.log").read_bytes()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(agent, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(agent, 0)


async def test_the_agents_stop_of_a_container_signals_it_once_and_its_exit_status_comes_through(tmp_path: Path) -> None:
    """stop_member on a container under the shim: one SIGTERM (the `run` client's --sig-proxy does not add one)."""
    cli, argv = _fake_container(tmp_path, "fg-b-r0", "exit")
    r, w = os.pipe()
    proc = await asyncio.create_subprocess_exec(
        *shim_argv(5.0, w, cli=cli, container="fg-b-r0"), *argv, start_new_session=True, pass_fds=(w,)
    )
    os.close(w)
    _groups.append(proc.pid)
    client = int((await asyncio.to_thread(_read_status, r)).split()[1])
    box = await asyncio.to_thread(_box_pid, tmp_path)
    member = RunningMember("b", "j", 1, 0, proc.pid, 5.0, runtime=cli, container="fg-b-r0", proc=proc)
    await stop_member(member)
    assert proc.returncode == 3, "the shim's status is not the container's"
    await until(lambda: not pid_alive(box) and not pid_alive(client))  # killed; gone once reaped
    assert (tmp_path / "terms").read_text() == "TERM\n", "the container got SIGTERM more than once"


def _write_lease(path: Path, until: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{until:.6f}\n")
    tmp.replace(path)


def test_a_recorded_member_outlives_its_agent_within_its_lease_renewed_by_the_file(tmp_path: Path) -> None:
    """Adoptable mode: once the agent wrote the lease file, the agent's death stops nothing; renewals through the
    file (the agent's next run) keep the member; when they stop, SIGTERM at the lease's end, SIGKILL a grace later."""
    lease, grace = 1.5, 1.0
    lease_file, exit_file = tmp_path / "m.lease", tmp_path / "m.exit"
    agent = os.fork()
    if agent == 0:  # the "agent": start the member, record it (the lease file), then die without stopping it
        try:
            r, w = os.pipe()
            files = (lease_file, exit_file)
            argv = [*shim_argv(grace, w, lease_until=lease_clock() + lease, files=files), sys.executable, "-c", MEMBER, str(tmp_path)]
            proc = subprocess.Popen(argv, start_new_session=True, preexec_fn=_term_with_agent, pass_fds=(w,))
            os.close(w)
            _read_status(r)
            _write_lease(lease_file, lease_clock() + lease)
            (tmp_path / "shim.pid").write_text(str(proc.pid))
            time.sleep(0.3)  # the shim sees the file
        finally:
            os._exit(0)
    os.waitpid(agent, 0)
    shim = int((tmp_path / "shim.pid").read_text())
    _groups.append(shim)
    _wait(lambda: (tmp_path / "member.pid").exists())
    member = int((tmp_path / "member.pid").read_text())
    # The agent is dead; a next run of it renews the lease through the file: the member runs on.
    renewed_until = time.monotonic() + 3 * lease
    while time.monotonic() < renewed_until:
        _write_lease(lease_file, lease_clock() + lease)
        assert pid_alive(member) and not (tmp_path / "child.term").exists(), "stopped although its lease was renewed"
        time.sleep(lease / 5)
    stopped_at = time.monotonic()
    _wait(lambda: (tmp_path / "child.term").exists(), timeout=30)  # the lease ran out: SIGTERM to the group
    _wait(lambda: not pid_alive(member), timeout=30)
    assert time.monotonic() - stopped_at >= grace, "killed before the grace period was over"
    _wait(lambda: not pid_alive(shim), timeout=10)


def test_an_agent_that_dies_before_it_recorded_its_member_takes_it_down(tmp_path: Path) -> None:
    """Adoptable mode, but no lease file yet: the member ends with its agent, as without adoption."""
    lease_file, exit_file = tmp_path / "m.lease", tmp_path / "m.exit"
    agent = os.fork()
    if agent == 0:
        try:
            r, w = os.pipe()
            argv = [*shim_argv(1.0, w, lease_until=lease_clock() + 3600, files=(lease_file, exit_file)), sys.executable, "-c", MEMBER]
            subprocess.Popen([*argv, str(tmp_path)], start_new_session=True, preexec_fn=_term_with_agent, pass_fds=(w,))
            os.close(w)
            _read_status(r)
            while not (tmp_path / "member.pid").exists():
                time.sleep(0.01)
        finally:
            os._exit(0)
    os.waitpid(agent, 0)
    member = int((tmp_path / "member.pid").read_text())
    _groups.append(os.getpgid(member))
    _wait(lambda: (tmp_path / "child.term").exists())
    _wait(lambda: not pid_alive(member), timeout=30)


def test_an_adoptable_members_exit_status_is_written_for_an_agent_that_did_not_start_it(tmp_path: Path) -> None:
    lease_file, exit_file = tmp_path / "m.lease", tmp_path / "m.exit"
    _write_lease(lease_file, lease_clock() + 3600)
    for code, expected in (("import sys; sys.exit(5)", "5"), ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "-15")):
        r, w = os.pipe()
        argv = [*shim_argv(1.0, w, lease_until=lease_clock() + 3600, files=(lease_file, exit_file)), sys.executable, "-c", code]
        proc = subprocess.Popen(argv, start_new_session=True, pass_fds=(w,))
        os.close(w)
        _groups.append(proc.pid)
        assert _read_status(r).startswith("ok ")
        proc.wait(30)
        assert exit_file.read_text().strip() == expected
    # A member the shim stopped on its own (its lease ran out): the exit file says so.
    _write_lease(lease_file, lease_clock() + 0.5)
    r, w = os.pipe()
    argv = [
        *shim_argv(1.0, w, lease_until=lease_clock() + 0.5, files=(lease_file, exit_file)),
        sys.executable,
        "-c",
        "import time; time.sleep(60)",
    ]
    proc = subprocess.Popen(argv, start_new_session=True, pass_fds=(w,))
    os.close(w)
    _groups.append(proc.pid)
    assert _read_status(r).startswith("ok ")
    proc.wait(30)
    assert exit_file.read_text().strip() == "-15 fenced"
