"""The whole platform as real processes: `fairgang dev` with a test cluster.

Real Temporal dev server, real store (SQLite or PostgreSQL), real API, placement service,
workflow worker and simulated-GPU agents running real job processes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from benchmarks.ports import free_port
from fairgang.cluster import ClusterConfig
from tests.conftest import _PG_PROBLEM, create_pg_database, drop_pg_database, small_cluster

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}
REPO = Path(__file__).resolve().parents[2]


class Platform:
    """A running `fairgang dev` and a client for its API."""

    def __init__(self, data_dir: Path, database_url: str | None, cluster: ClusterConfig | None = None) -> None:
        self.data_dir = data_dir
        self.database_url = database_url
        self.api_port, self.temporal_port, self.ui_port = free_port(), free_port(), free_port()
        self.config_path = data_dir / "cluster.yaml"
        data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump((cluster or small_cluster()).model_dump(mode="json")))
        self.proc: subprocess.Popen[bytes] | None = None
        #: More environment for `fairgang dev` and its parts (set before start()).
        self.extra_env: dict[str, str] = {}
        #: Run `fairgang dev` as the leader of a process group of its own (set before start()), so that a
        #: test can send Ctrl-C to the whole group, as a terminal does.
        self.own_process_group = False
        self.api_url = f"http://127.0.0.1:{self.api_port}"
        self.temporal_address = f"127.0.0.1:{self.temporal_port}"

    def start(self) -> None:
        env = dict(os.environ)
        env.pop("DATABASE_URL", None)
        if self.database_url:
            env["DATABASE_URL"] = self.database_url
        env.update(
            {
                "FAIRGANG_ACTIVITY_HEARTBEAT_TIMEOUT_S": "5",
                "FAIRGANG_INFRA_RETRY_BACKOFF_S": "1",
                "FAIRGANG_NODE_HEARTBEAT_INTERVAL_S": "1",
                "FAIRGANG_SCHEDULER_TICK_S": "2",
                # Short, but with room for a loaded machine (three platforms at once under pytest-xdist):
                # a node silent 6 s gets no new work and is declared lost after 10 s; an agent fences itself
                # after 8 s without the API, before its node can be declared lost.
                "FAIRGANG_NODE_STALE_AFTER_S": "6",
                "FAIRGANG_NODE_LOST_AFTER_S": "10",
                "FAIRGANG_SELF_FENCE_AFTER_S": "8",
                "FAIRGANG_LAUNCH_START_TIMEOUT_S": "15",
                "FAIRGANG_MIN_RUNTIME_BEFORE_PREEMPT_S": "1",
                # Small sweep batches, so that sweeps continue as new in the tests.
                "FAIRGANG_SWEEP_BATCH_SIZE": "2",
            }
        )
        env.update(self.extra_env)
        argv = [sys.executable, "-m", "cli", "dev", "--config", str(self.config_path), "--data-dir", str(self.data_dir)]
        argv += ["--api-port", str(self.api_port), "--temporal-port", str(self.temporal_port), "--ui-port", str(self.ui_port)]
        log = self.data_dir / "dev.log"
        offset = log.stat().st_size if log.exists() else 0
        out = open(log, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=self.own_process_group
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fairgang dev exited {self.proc.returncode}:\n{self.logs()}")
            if b"ready:" in log.read_bytes()[offset:]:
                return
            time.sleep(0.3)
        raise TimeoutError(f"fairgang dev did not become ready:\n{self.logs()}")

    def logs(self) -> str:
        text = (self.data_dir / "dev.log").read_text(errors="replace")
        for path in sorted((self.data_dir / "process-logs").glob("*.log")):
            if path.name != "temporal.log":
                text += f"\n--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
        return text

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'fairgang.db'}"

    def part_env(self) -> dict[str, str]:
        """The environment `fairgang dev` gives its parts (to start another one beside them)."""
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env.update(
            {
                "FAIRGANG_DATABASE_URL": self.store_url,
                "FAIRGANG_TEMPORAL_ADDRESS": self.temporal_address,
                "FAIRGANG_API_URL": self.api_url,
                "FAIRGANG_SCHEDULER_TICK_S": "2",
                "FAIRGANG_NODE_STALE_AFTER_S": "6",
                "FAIRGANG_NODE_LOST_AFTER_S": "10",
            }
        )
        return env

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        time.sleep(2.0)  # children follow through PR_SET_PDEATHSIG

    def client(self, token: str) -> httpx.Client:
        return httpx.Client(base_url=self.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def submit(self, spec: dict[str, Any], token: str = "alpha-token") -> dict[str, Any]:
        with self.client(token) as http:
            resp = http.post("/v1/jobs", json=spec)
            assert resp.status_code in (200, 201), resp.text
            return dict(resp.json()["job"])

    def job(self, job_id: str, token: str = "admin-token") -> dict[str, Any]:
        """The job's view; retried while the API is down (a test may have killed it)."""
        deadline = time.monotonic() + 30
        while True:
            try:
                with self.client(token) as http:
                    return dict(http.get(f"/v1/jobs/{job_id}").json())
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def wait_for(self, job_id: str, states: set[str], timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            time.sleep(0.25)
        raise AssertionError(f"job {job_id} stayed {job.get('state')} (wanted {states}): {job}\n{self.logs()}")


def job_spec(name: str, code: str, **extra: Any) -> dict[str, Any]:
    """A spec whose process runs a Python snippet."""
    spec = {
        "name": name,
        "entrypoint": [sys.executable, "-c", code],
        "gpu_type": "H100-80GB",
        "gpu_count": 1,
        "max_runtime": "10m",
        "checkpoint_dir": f"/ckpt/alpha/{name}",
        "grace_period": "5s",
    }
    spec.update(extra)
    return spec


def only(backend: str) -> pytest.MarkDecorator:
    """Run a test's platform on one store only. Each store's own code is tested on both backends below the
    platform (tests/store, tests/api); the whole platform runs every crash-safety test on both, and each other
    scenario on one, the two stores taking turns, so that the suite stays within its time."""
    return pytest.mark.parametrize("platform_factory", [backend], indirect=True)


def _database_for(backend: str) -> str | None:
    if backend == "sqlite":
        return None
    if _PG_PROBLEM:
        if os.environ.get("FAIRGANG_REQUIRE_POSTGRES"):
            pytest.fail(_PG_PROBLEM)
        pytest.skip(_PG_PROBLEM)
    return asyncio.run(create_pg_database())


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def platform_factory(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Makes platforms on the backend under test and stops them all at the end."""
    made: list[Platform] = []
    databases: list[str] = []

    def make(cluster: ClusterConfig | None = None) -> Platform:
        url = _database_for(str(request.param))
        if url:
            databases.append(url)
        platform = Platform(tmp_path_factory.mktemp(f"dev-{request.param}"), url, cluster)
        made.append(platform)
        return platform

    yield make
    for platform in made:
        platform.stop()
    for url in databases:
        asyncio.run(drop_pg_database(url))


@pytest.fixture(scope="module")
def platform(platform_factory: Any) -> Platform:
    p: Platform = platform_factory()
    p.start()
    return p


#: Member leases (and the lost-node timeout, above them) long enough to restart agents or the whole platform
#: within them, however loaded the machine (the test platform's own, 8 s and 10 s, are for tests of losses).
RESTART_WITHIN_LEASE = {"FAIRGANG_SELF_FENCE_AFTER_S": "60", "FAIRGANG_NODE_LOST_AFTER_S": "90"}
