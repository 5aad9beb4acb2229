"""The `fairgang` command reports an API it cannot reach, or one that does not answer, in one line."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(url: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"FAIRGANG_API_URL": url, "FAIRGANG_TOKEN": "t", "PATH": "/usr/bin:/bin", "COLUMNS": "200", **extra}
    return subprocess.run([sys.executable, "-m", "cli", "fleet"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_an_unreachable_api_is_one_clear_line() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = _run(f"http://127.0.0.1:{port}")
    assert out.returncode == 1
    assert "cannot reach the API" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_a_silent_api_is_one_clear_line() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    out = _run(f"http://127.0.0.1:{server.getsockname()[1]}", FAIRGANG_CLI_TIMEOUT_S="1")
    server.close()
    assert out.returncode == 1
    assert "did not answer in time" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout
