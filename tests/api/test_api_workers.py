"""`fairgang api --workers N`: N API processes on one port, each serving the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from benchmarks.ports import free_port
from store.db import migrate_sync


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except OSError:
                continue
    return out


def test_api_workers_share_the_port(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'fairgang.db'}"
    migrate_sync(url)
    port = free_port()
    env = {**os.environ, "FAIRGANG_DATABASE_URL": url, "FAIRGANG_TEMPORAL_ADDRESS": "127.0.0.1:1", "FAIRGANG_LOG_DIR": str(tmp_path)}
    env.pop("DATABASE_URL", None)
    cmd = [sys.executable, "-m", "cli", "api", "--port", str(port), "--workers", "2"]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        served = 0
        while time.monotonic() < deadline and served < 5:
            assert proc.poll() is None, f"the API exited with {proc.returncode}"
            try:
                # An unknown token is refused by whichever worker answers: it read the store to say so.
                resp = httpx.get(f"http://127.0.0.1:{port}/v1/fleet", headers={"Authorization": "Bearer nobody"}, timeout=5)
                assert resp.status_code == 401
                served += 1
            except httpx.TransportError:
                time.sleep(0.2)
        assert served == 5, "the API did not answer"
        # uvicorn starts each worker through multiprocessing's spawn.
        workers = [p for p in _children(proc.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")]
        assert len(workers) == 2, workers
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
