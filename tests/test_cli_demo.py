"""`make demo` (`fairgang dev --demo`): its example jobs are admitted, the README's spec is one, and a refusal fails the demo.

The example jobs go through the real API in-process, over a store seeded from examples/cluster.yaml
(Temporal unreachable: admission and storage are all that is asked of it here).
"""

from __future__ import annotations

import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from api.app import create_app
from api.deps import AppState
from cli import dev as dev_cli
from cli.main import app as cli_app
from fairgang.cluster import ClusterConfig, load_cluster_config
from fairgang.settings import Settings
from fairgang.spec import load_spec_text
from store import jobs as stored_jobs
from store import tenants as stored_tenants
from store.db import Database, migrate

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster.yaml"


@pytest.fixture
async def example_api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Database]]:
    url = f"sqlite+aiosqlite:///{tmp_path / 'fairgang.db'}"
    await migrate(url)
    db = Database(url)
    await stored_tenants.seed_cluster(db, load_cluster_config(CLUSTER))
    settings = Settings(database_url=url, temporal_address="127.0.0.1:1", log_dir=tmp_path / "logs")
    app = create_app(settings)
    app.state.fairgang = AppState(settings=settings, db=db)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as client:
            yield client, db
    finally:
        await db.dispose()


async def test_every_example_job_is_admitted_under_the_example_cluster(
    example_api: tuple[httpx.AsyncClient, Database], monkeypatch: pytest.MonkeyPatch
) -> None:
    api, db = example_api
    monkeypatch.chdir(ROOT)
    jobs = dev_cli._demo_jobs(load_cluster_config(CLUSTER))
    assert len(jobs) == len(list((ROOT / "examples" / "jobs").glob("*.yaml"))) >= 3
    for path, body, token in jobs:
        assert token is not None, f"{path.name}: its tenant has no token in {CLUSTER.name}"
        resp = await api.post("/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"})
        assert resp.status_code == 201, f"{path.name}: {resp.text}"
    stored = await stored_jobs.list_jobs(db)
    assert len(stored) == len(jobs)
    assert len({j.tenant for j in stored}) >= 3  # the demo shows three teams sharing the fleet


def _readme_job_spec() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The job spec", 1)[1]
    match = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert match is not None, "README: no yaml block under 'The job spec'"
    return match.group(1)


async def test_the_readme_job_spec_parses_and_is_admitted(example_api: tuple[httpx.AsyncClient, Database]) -> None:
    api, _ = example_api
    spec = load_spec_text(_readme_job_spec())
    assert spec.tenant == "vision" and spec.gpu_count == 4 and spec.topology.level == "leaf"
    assert spec.max_runtime == 3600 and spec.grace_period == 10 and spec.idempotency_key == "resnet-2026-11-30"
    body = spec.model_dump(mode="json", exclude_none=True)
    resp = await api.post("/v1/jobs", json=body, headers={"Authorization": "Bearer vision-dev-token"})
    assert resp.status_code == 201, resp.text


class _Platform:
    """Stands in for cli.platform.DevPlatform: starts nothing, records that it was stopped."""

    stopped = False

    def __init__(self, **kwargs: Any) -> None:
        self.settings = Settings(api_url="http://demo.invalid", temporal_ui_url="http://demo.invalid:8233")

    def start(self, say: Any = print) -> None:
        pass

    def wait_ready(self, token: str, timeout: float = 60.0) -> None:
        pass

    def supervise(self, say: Any = None) -> None:
        raise AssertionError("the demo must stop at a refused example, not keep running")

    def stop(self, timeout: float = 15.0) -> None:
        _Platform.stopped = True


def test_a_refused_example_job_fails_the_demo_with_exit_status_1(monkeypatch: pytest.MonkeyPatch) -> None:
    import cli.platform

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(cli.platform, "DevPlatform", _Platform)
    posted: list[str] = []

    def post(url: str, *, json: dict[str, Any], **kwargs: Any) -> httpx.Response:
        posted.append(json["name"])
        if json["tenant"] == "speech":
            return httpx.Response(422, json={"detail": {"error": "job spec refused", "problems": [{"field": "gpu_type", "reason": "no"}]}})
        return httpx.Response(201, json={"job": {"id": f"j-{json['name']}", "tenant": json["tenant"]}})

    def get(*args: Any, **kwargs: Any) -> httpx.Response:
        raise AssertionError("the demo must not follow its jobs after a refusal")

    monkeypatch.setattr(dev_cli.httpx, "post", post)
    monkeypatch.setattr(dev_cli.httpx, "get", get)
    sigterm = signal.getsignal(signal.SIGTERM)  # `dev` installs its own handler
    try:
        result = CliRunner().invoke(cli_app, ["dev", "--config", str(CLUSTER), "--demo"], env={"COLUMNS": "200"})
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    assert "example job refused" in result.output and "speech-whisper.yaml" in result.output and "gpu_type" in result.output
    assert len(posted) == 3  # every example is tried, so all refusals show at once
    assert _Platform.stopped


def test_example_cluster_and_jobs_are_what_the_demo_promises() -> None:
    cluster: ClusterConfig = load_cluster_config(CLUSTER)
    assert cluster.admin_tokens and all(t.tokens for t in cluster.tenants)
    tenants = {load_spec_text(p.read_text()).tenant for p in (ROOT / "examples" / "jobs").glob("*.yaml")}
    assert tenants <= {t.name for t in cluster.tenants} and len(tenants) >= 3
