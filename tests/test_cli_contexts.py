"""Contexts (cli/contexts.py): named API addresses and tokens in a 0600 config file; the current one is what a
command uses unless --api/--token (or their variables) say otherwise."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(config: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "FAIRGANG_CONFIG": str(config), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, env=base | env, capture_output=True, text=True, timeout=120)


def test_contexts_are_kept_private_and_the_current_one_is_used(tmp_path: Path) -> None:
    config = tmp_path / "fairgang" / "config.yaml"
    prod, dev = closed_port(), closed_port()
    assert run(config, "config", "set-context", "prod", "--api", f"http://127.0.0.1:{prod}", "--token", "prod-token").returncode == 0
    assert run(config, "config", "set-context", "dev", "--api", f"http://127.0.0.1:{dev}", "--token", "dev-token").returncode == 0
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    data = yaml.safe_load(config.read_text())
    assert data["current-context"] == "prod" and data["contexts"]["dev"] == {"api": f"http://127.0.0.1:{dev}", "token": "dev-token"}
    listed = run(config, "config", "get-contexts").stdout
    prod_line = next(line for line in listed.splitlines() if " prod " in line)
    assert "*" in prod_line and "dev-to..." in listed
    assert "dev-token" not in listed  # tokens are not printed whole
    # A command goes to the current context's API (here: nothing listens there, which it says).
    assert f"127.0.0.1:{prod}" in run(config, "fleet").stderr
    assert run(config, "config", "use-context", "dev").returncode == 0
    assert f"127.0.0.1:{dev}" in run(config, "fleet").stderr
    assert f"127.0.0.1:{prod}" in run(config, "fleet", FAIRGANG_CONTEXT="prod").stderr
    # --api (or FAIRGANG_API_URL) and a token win over the context.
    other = closed_port()
    assert f"127.0.0.1:{other}" in run(config, "fleet", FAIRGANG_API_URL=f"http://127.0.0.1:{other}", FAIRGANG_TOKEN="t").stderr
    # Mistakes name what is wrong.
    assert "no context 'qa'" in run(config, "config", "use-context", "qa").stderr
    assert "'qa' is not in" in run(config, "fleet", FAIRGANG_CONTEXT="qa").stderr
    assert "--api" in run(config, "config", "set-context", "new").stderr
    assert run(config, "config", "delete-context", "dev").returncode == 0
    assert "current-context" not in yaml.safe_load(config.read_text())
    assert "no token" in run(config, "fleet").stderr
