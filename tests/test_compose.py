"""docker-compose.yml: valid for docker-compose, and wired the way the platform needs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fairgang.cluster import load_cluster_config, node_credential

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


def test_agent_api_and_worker_share_the_log_volume() -> None:
    """The API serves the jobs' logs and the worker reads a sweep's metrics from them: both see the agent's."""
    services = _services()
    log_dir = services["api"]["environment"]["FAIRGANG_LOG_DIR"]
    for name in ("api", "agent", "worker"):
        assert services[name]["environment"]["FAIRGANG_LOG_DIR"] == log_dir
        assert f"fairgang-logs:{log_dir}" in services[name]["volumes"], name
    assert "fairgang-logs" in _compose()["volumes"]


def _dockerfile_dirs() -> set[str]:
    """The directories the Dockerfile makes and gives to the image's user."""
    text = (ROOT / "Dockerfile").read_text()
    made = set(re.findall(r"mkdir -p ([^\\&\n]+)", text)[0].split())
    assert "chown -R fairgang:fairgang /var/lib/fairgang" in text and re.search(r"^USER 10001", text, re.M)
    return made


def test_every_place_the_services_write_is_absolute_made_and_owned_by_the_image_user_and_kept_in_a_volume() -> None:
    """The image's user may not write its working directory (/app is root's): a relative state, log or
    checkpoint location, or one the image does not make, would fail the agent's first job."""
    services, made = _services(), _dockerfile_dirs()
    env = services["agent"]["environment"]
    for key in ("FAIRGANG_LOG_DIR", "FAIRGANG_AGENT_STATE_DIR", "FAIRGANG_CHECKPOINT_ROOT"):
        path = env[key]
        assert path.startswith("/var/lib/fairgang/") and path in made, (key, path)
        assert any(v.endswith(f":{path}") for v in services["agent"]["volumes"]), f"the agent keeps {key} in no volume"
    text = (ROOT / "Dockerfile").read_text()
    for key in ("FAIRGANG_LOG_DIR", "FAIRGANG_AGENT_STATE_DIR", "FAIRGANG_CHECKPOINT_ROOT"):
        assert f"{key}={env[key]}" in text, f"the image's own default of {key} differs from the compose file's"


def test_agent_matches_the_seeded_cluster() -> None:
    """The agent's node id is a node the seed loads into the store, and its token that node's credential."""
    services = _services()
    seed_mounts = [v for v in services["seed"]["volumes"] if v.endswith(":/etc/fairgang/cluster.yaml:ro")]
    assert seed_mounts, "the seed service does not mount a cluster config"
    config = load_cluster_config(ROOT / seed_mounts[0].split(":", 1)[0])
    agent = services["agent"]
    argv = agent["command"]
    node_id = argv[argv.index("--node-id") + 1]
    assert agent["environment"]["FAIRGANG_NODE_TOKEN"] == node_credential(config.node_token, node_id)
    node = next((n for n in config.nodes if n.id == node_id), None)
    assert node is not None, f"node {node_id} is not in the cluster config"
    assert node.gpu_type == argv[argv.index("--gpu-type") + 1]
    assert node.gpus == int(argv[argv.index("--gpus") + 1])
    labels = dict(argv[i + 1].split("=", 1) for i, arg in enumerate(argv) if arg == "--label")
    assert labels == node.labels


def _port(address: str) -> int:
    return int(str(address).rsplit(":", 1)[1])


def test_prometheus_scrapes_every_metrics_endpoint_of_the_compose_file() -> None:
    services = _services()
    prometheus = services["prometheus"]
    mounts = [v for v in prometheus["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro")]
    assert mounts, "the prometheus service does not mount deploy/prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = yaml.safe_load((ROOT / mounts[0].split(":", 1)[0]).read_text())
    targets = {t for job in config["scrape_configs"] for static in job["static_configs"] for t in static["targets"]}
    paths = {job.get("metrics_path", "/metrics") for job in config["scrape_configs"]}
    assert paths == {"/metrics"}
    # The API's own port, the placement service's metrics port, every Temporal SDK metrics address.
    api_argv = services["api"]["command"]
    assert f"api:{api_argv[api_argv.index('--port') + 1]}" in targets
    scheduler_env = services["scheduler"]["environment"]
    assert f"scheduler:{scheduler_env['FAIRGANG_SCHEDULER_METRICS_PORT']}" in targets
    assert scheduler_env["FAIRGANG_METRICS_HOST"] == "0.0.0.0", "the placement service's metrics must listen beyond loopback"
    for name in ("worker", "agent", "scheduler"):
        bind = services[name]["environment"]["FAIRGANG_TEMPORAL_METRICS_BIND"]
        assert bind.startswith("0.0.0.0:") and f"{name}:{_port(bind)}" in targets, name
    assert "FAIRGANG_TEMPORAL_METRICS_BIND" not in services["api"]["environment"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (apt-get install prometheus)")
def test_promtool_accepts_the_scrape_config() -> None:
    result = subprocess.run(["promtool", "check", "config", "deploy/prometheus.yml"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    services = _services()
    grafana = services["grafana"]
    assert "prometheus" in grafana["depends_on"]
    mounts = dict(v.rsplit(":", 2)[:2] for v in grafana["volumes"] if v.startswith("./"))
    provisioning = ROOT / next(src for src, dst in mounts.items() if dst == "/etc/grafana/provisioning")
    dashboards_dir = ROOT / next(src for src, dst in mounts.items() if dst == "/var/lib/grafana/dashboards")
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "fairgang.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"

    documented = set(re.findall(r"`(fairgang_[a-z_]+)`", (ROOT / "docs" / "metrics.md").read_text()))
    dashboard = json.loads((dashboards_dir / "fairgang.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {re.sub(r"_(bucket|count|sum|total)$", "", m) for e in exprs for m in re.findall(r"\bfairgang_[a-z_]+", e)}
    undocumented = {m for m in used if m not in documented and f"{m}_total" not in documented}
    assert not undocumented, f"the dashboard uses metrics docs/metrics.md does not list: {undocumented}"
    wanted = {"fairgang_gpus", "fairgang_gpu_utilization_ratio", "fairgang_queue_length", "fairgang_queue_wait_seconds"}
    wanted |= {"fairgang_tenant_dominant_share", "fairgang_preemptions", "fairgang_health_events", "fairgang_scheduling_cycle_seconds"}
    assert wanted <= used, f"no panel shows {wanted - used}"
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == source["uid"], panel["title"]
