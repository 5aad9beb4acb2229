"""The compose deployment's processes, run the way its services run them, take the README's example job and
sweep to the end.

Images cannot be pulled here, so the test starts what docker-compose.yml's services start, read from the file:
each service's command after the image's entrypoint (`fairgang`), its environment (the file's, with the image's
own defaults), the image's user (uid 10001, who cannot write to its working directory, the source tree: /app
in the image) and its paths. Only what names another container changes: host names and ports become local
ones, and /var/lib/fairgang, the image's writable root (its volumes: logs for the API, the worker and the
agent; checkpoints and agent state for the agent), becomes a directory of the test's, made and owned as the
Dockerfile makes it. The one-shots (migrate, seed, the search attributes) run first, the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from cli.platform import temporal_binary, wait_for_port
from tests.conftest import _PG_PROBLEM, create_pg_database, drop_pg_database
from tests.e2e.conftest import REPO, free_port

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
#: The image's user (Dockerfile: USER 10001:10001).
UID = 10001
#: The image's writable root; its ENV and the compose file put every written path under it.
IMAGE_ROOT = "/var/lib/fairgang"
TOKEN = "vision-compose-token"
#: A Python that the image's user can run (the project's venv Python may live in root's home), of the same
#: version as this one, with the project and its dependencies on its path.
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
SITE_PACKAGES = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _others_can_enter(path: Path) -> bool:
    """Can a user other than the owner (uid 10001 here) reach ``path``: every folder on the way searchable by others?"""
    return all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents))


pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the services as the image's uid 10001: needs root"),
    pytest.mark.skipif(not _others_can_enter(REPO), reason=f"uid 10001 cannot enter the checkout {REPO} (a folder on the way is private)"),
    pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason=f"{SYSTEM_PYTHON} is not installed (the image's user cannot run root's)"),
]


def image_env() -> dict[str, str]:
    """The Dockerfile's ENV lines."""
    env: dict[str, str] = {}
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("ENV "):
            for pair in line.removeprefix("ENV ").split():
                key, _, value = pair.partition("=")
                env[key] = value
    return env


class ComposeHost:
    """The compose services as processes of uid 10001 on this host."""

    def __init__(self, root: Path, database_url: str) -> None:
        self.root = root
        self.database_url = database_url
        self.api_port, self.temporal_port, self.ui_port = free_port(), free_port(), free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs = root / "process-logs"
        self.logs.mkdir()

    def path(self, value: str) -> str:
        return value.replace(IMAGE_ROOT, str(self.root / "var-lib-fairgang"))

    def env(self, service: str) -> dict[str, str]:
        """The service's environment: the image's, the compose file's, with other containers' addresses local."""
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(REPO)}
        env.update(image_env())
        env.update({k: str(v) for k, v in COMPOSE["services"][service].get("environment", {}).items()})
        env.update(
            {
                "DATABASE_URL": self.database_url,
                "FAIRGANG_TEMPORAL_ADDRESS": f"127.0.0.1:{self.temporal_port}",
                "FAIRGANG_API_URL": f"http://127.0.0.1:{self.api_port}",
                "PYTHONPATH": f"{REPO}:{SITE_PACKAGES}",
            }
        )
        # Each container binds its metrics ports on its own address; here they share one.
        if "FAIRGANG_SCHEDULER_METRICS_PORT" in env:
            env["FAIRGANG_SCHEDULER_METRICS_PORT"] = str(free_port())
        if "FAIRGANG_TEMPORAL_METRICS_BIND" in env:
            env["FAIRGANG_TEMPORAL_METRICS_BIND"] = f"127.0.0.1:{free_port()}"
        return {k: self.path(v) for k, v in env.items()}

    def argv(self, service: str) -> list[str]:
        """The image's entrypoint (`fairgang`) and the service's command, its mounted files and ports local."""
        spec = COMPOSE["services"][service]
        entry = spec.get("entrypoint", ["fairgang"])
        command = [str(a) for a in spec.get("command", [])]
        mounts = {m.split(":")[1]: m.split(":")[0] for m in spec.get("volumes", []) if m.startswith("./")}
        command = [str(REPO / mounts[a].removeprefix("./")) if a in mounts else a for a in command]
        command = [
            {"0.0.0.0": "127.0.0.1", "8080": str(self.api_port), "temporal:7233": f"127.0.0.1:{self.temporal_port}"}.get(a, a)
            for a in command
        ]
        if entry == ["fairgang"]:
            return [SYSTEM_PYTHON, "-m", "cli", *command]
        assert entry == ["temporal"], entry
        return [temporal_binary(), *command]

    def run(self, service: str) -> None:
        """A one-shot service, to its end."""
        out = subprocess.run(self.argv(service), env=self.env(service), cwd=REPO, user=UID, group=UID, capture_output=True, timeout=120)
        assert out.returncode == 0, (service, out.stdout.decode()[-2000:], out.stderr.decode()[-2000:])

    def start(self, service: str) -> None:
        log = (self.logs / f"{service}.log").open("wb")
        self.procs[service] = subprocess.Popen(
            self.argv(service), env=self.env(service), cwd=REPO, user=UID, group=UID, stdout=log, stderr=subprocess.STDOUT
        )

    def temporal(self) -> None:
        """The Temporal server (another image in the compose file): a dev server, as root."""
        argv = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.temporal_port)]
        argv += ["--ui-port", str(self.ui_port), "--headless", "--log-level", "warn"]
        self.procs["temporal"] = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=(self.logs / "temporal.log").open("wb"))
        wait_for_port("127.0.0.1", self.temporal_port)

    def dump(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.logs.glob("*.log")))

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = os.environ | {"FAIRGANG_API_URL": f"http://127.0.0.1:{self.api_port}", "FAIRGANG_TOKEN": TOKEN}
        return subprocess.run([sys.executable, "-m", "cli", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture
def host() -> Iterator[ComposeHost]:
    if _PG_PROBLEM:
        if os.environ.get("FAIRGANG_REQUIRE_POSTGRES"):
            pytest.fail(_PG_PROBLEM)
        pytest.skip(_PG_PROBLEM)
    url = asyncio.run(create_pg_database())
    # Outside root's private temporary directory, where uid 10001 can reach it.
    root = Path(tempfile.mkdtemp(prefix="fairgang-compose-", dir="/tmp"))
    root.chmod(0o755)
    # As the Dockerfile: mkdir -p /var/lib/fairgang/{logs,agent-state,checkpoints}; chown -R fairgang.
    for sub in ("logs", "agent-state", "checkpoints"):
        (root / "var-lib-fairgang" / sub).mkdir(parents=True)
    for path in (root / "var-lib-fairgang", *(root / "var-lib-fairgang").iterdir()):
        os.chown(path, UID, UID)
    h = ComposeHost(root, url)
    try:
        yield h
    finally:
        h.stop()
        shutil.rmtree(root, ignore_errors=True)
        asyncio.run(drop_pg_database(url))


def test_the_compose_services_processes_run_the_example_job_and_sweep_as_the_image_user(host: ComposeHost) -> None:
    # The image's user cannot write where it runs (the source tree), as in the image.
    probe = subprocess.run(["touch", str(REPO / ".write-probe")], user=UID, group=UID, capture_output=True)
    assert probe.returncode != 0, "uid 10001 can write to the source tree: the test would not show the image's trouble"
    host.temporal()
    for one_shot in ("temporal-admin-tools", "migrate", "seed"):
        host.run(one_shot)
    for service in ("api", "worker", "scheduler"):
        host.start(service)
    wait_for_port("127.0.0.1", host.api_port, timeout=60)
    host.start("agent")
    deadline = time.monotonic() + 90
    while True:
        try:
            fleet = httpx.get(f"http://127.0.0.1:{host.api_port}/v1/fleet", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
            if any(n["id"] == "node-1" and n["schedulable"] for n in fleet["nodes"]):
                break
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        assert time.monotonic() < deadline, host.dump()
        time.sleep(0.5)

    # The README's compose example: submit the example job and wait for it.
    job = host.cli("submit", "examples/jobs/vision-resnet.yaml", "--wait", "-o", "json")
    assert job.returncode == 0, (job.stdout, job.stderr, host.dump())
    with httpx.Client(base_url=f"http://127.0.0.1:{host.api_port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        detail = http.get(f"/v1/jobs/{json.loads(job.stdout)['id']}").json()
        assert detail["state"] == "SUCCEEDED", detail
        # Its checkpoints were written where the image's user may write, and reported; its log is readable.
        assert detail["latest_checkpoint"], detail
        ckpts = host.root / "var-lib-fairgang" / "checkpoints" / "checkpoints" / "vision" / "resnet50"
        assert any(ckpts.iterdir()) and all(p.stat().st_uid == UID for p in ckpts.iterdir())
        assert "step" in http.get(f"/v1/jobs/{detail['id']}/logs").text

        # The example sweep: every trial runs, and the worker reads their metrics from the shared logs.
        sweep = host.cli("sweep", "submit", "examples/sweeps/lr-features.yaml", "--wait", "-o", "json")
    assert sweep.returncode == 0, (sweep.stdout, sweep.stderr, host.dump())
    found = json.loads(sweep.stdout)
    assert found["state"] == "COMPLETED" and found["trial_count"] == 6, found
    summary = found["summary"]
    assert summary["best"] is not None and not summary.get("metrics_unreadable"), summary
