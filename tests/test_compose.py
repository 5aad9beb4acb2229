"""docker-compose.yml: valid for docker-compose, and wired the way the platform needs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairgang.cluster import load_cluster_config

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
FAIRGANG_SERVICES = ("api", "scheduler", "worker", "agent")


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


def _services() -> dict[str, Any]:
    services = _compose()["services"]
    assert isinstance(services, dict)
    return services


def _build_context(service: dict[str, Any]) -> str | None:
    build = service.get("build")
    if isinstance(build, dict):
        return build.get("context")
    return build


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed (apt-get install docker-compose)")
def test_docker_compose_accepts_the_file() -> None:
    result = subprocess.run(
        ["docker-compose", "-f", "docker-compose.yml", "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_compose_has_the_platform_services() -> None:
    services = _services()
    for name in ("postgres", "temporal", "temporal-ui", *FAIRGANG_SERVICES):
        assert name in services, f"service {name} is missing"
    for name in FAIRGANG_SERVICES:
        assert _build_context(services[name]) == ".", f"service {name} is not built from the project's Dockerfile"
        assert services[name].get("restart") == "unless-stopped", f"service {name} is not restarted"


def test_one_shots_run_before_the_platform() -> None:
    services = _services()
    for name in ("migrate", "seed", "temporal-admin-tools"):
        assert services[name].get("restart") == "no", f"one-shot {name} must not be restarted"
    api_deps = services["api"]["depends_on"]
    for one_shot in ("migrate", "seed", "temporal-admin-tools"):
        assert api_deps[one_shot]["condition"] == "service_completed_successfully"
    assert services["seed"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["agent"]["depends_on"]["api"]["condition"] == "service_healthy"


def test_agent_and_api_share_the_log_volume() -> None:
    services = _services()
    log_dir = services["api"]["environment"]["FAIRGANG_LOG_DIR"]
    for name in ("api", "agent"):
        assert services[name]["environment"]["FAIRGANG_LOG_DIR"] == log_dir
        assert f"fairgang-logs:{log_dir}" in services[name]["volumes"]
    assert "fairgang-logs" in _compose()["volumes"]


def test_agent_matches_the_seeded_cluster() -> None:
    """The agent's node token and node id are the ones the seed loads into the store."""
    services = _services()
    seed_mounts = [v for v in services["seed"]["volumes"] if v.endswith(":/etc/fairgang/cluster.yaml:ro")]
    assert seed_mounts, "the seed service does not mount a cluster config"
    config = load_cluster_config(ROOT / seed_mounts[0].split(":", 1)[0])
    agent = services["agent"]
    assert agent["environment"]["FAIRGANG_NODE_TOKEN"] == config.node_token
    argv = agent["command"]
    node_id = argv[argv.index("--node-id") + 1]
    node = next((n for n in config.nodes if n.id == node_id), None)
    assert node is not None, f"node {node_id} is not in the cluster config"
    assert node.gpu_type == argv[argv.index("--gpu-type") + 1]
    assert node.gpus == int(argv[argv.index("--gpus") + 1])
    labels = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--label")
    assert labels == node.labels
