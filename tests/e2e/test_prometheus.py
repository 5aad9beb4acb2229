"""Debian's Prometheus scraping the real platform: fairgang metrics read back through its query API match the API (SPEC R7.1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml

from tests.e2e.conftest import REPO, Platform, free_port, job_spec

# Scraping is what is tested here, not the store: one backend is enough.
pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("platform_factory", ["sqlite"], indirect=True)]

SLEEP = "import time; time.sleep(600)"


@pytest.fixture(scope="module")
def platform(platform_factory: Any) -> Platform:
    """The platform, with the placement service's metrics port on."""
    p: Platform = platform_factory()
    p.extra_env["FAIRGANG_SCHEDULER_METRICS_PORT"] = str(free_port())
    p.start()
    return p


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return list(body["data"]["result"])

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: more than one series: {result}"
        return float(result[0]["value"][1]) if result else None

    def eventually(self, expr: str, want: float, timeout: float = 90) -> None:
        """The query's value becomes ``want`` (the latest scrape may predate the API's answer; on a loaded machine
        the API's view worker may recompute /metrics only after some seconds)."""
        deadline = time.monotonic() + timeout
        got = self.value(expr)
        while got != want and time.monotonic() < deadline:
            time.sleep(0.5)
            got = self.value(expr)
        assert got == want, f"{expr} = {got}, the API says {want}"


@pytest.fixture(scope="module")
def prometheus(platform: Platform, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        reason = "prometheus is not installed (apt-get install -y prometheus)"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    work = tmp_path_factory.mktemp("prometheus")
    api = platform.api_url.removeprefix("http://")
    scheduler = f"127.0.0.1:{platform.extra_env['FAIRGANG_SCHEDULER_METRICS_PORT']}"
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "fairgang-api", "static_configs": [{"targets": [api]}]},
            {"job_name": "fairgang-scheduler", "static_configs": [{"targets": [scheduler]}]},
        ],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}"]
    argv += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with open(work / "prometheus.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                reason = f"prometheus exited {proc.returncode}: {(work / 'prometheus.log').read_text()[-800:]}"
                print(reason, file=sys.stderr)
                pytest.skip(reason)
            try:
                if prom.value('min(up{job=~"fairgang-.*"})') == 1 and prom.value("count(up)") == 2:
                    break
            except (httpx.TransportError, ValueError, AssertionError):
                pass  # not listening yet, or answering "Service Unavailable" while it starts
            assert time.monotonic() < deadline, f"no successful scrape: {(work / 'prometheus.log').read_text()[-2000:]}"
            time.sleep(0.5)
        yield prom
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get(platform: Platform, path: str) -> Any:
    with platform.client("admin-token") as http:
        resp = http.get(path)
        assert resp.status_code == 200, resp.text
        return resp.json()


def test_prometheus_reads_the_same_numbers_as_the_api(platform: Platform, prometheus: Prometheus) -> None:
    running = platform.submit(job_spec("prom-running", SLEEP, gpu_count=2))
    platform.wait_for(running["id"], {"RUNNING"})
    waiting = platform.submit(job_spec("prom-waiting", SLEEP, gpu_count=16))  # needs both H100 nodes whole: it waits
    with platform.client("admin-token") as http:
        assert http.post("/v1/nodes/g1/cordon").status_code == 200

    fleet = get(platform, "/v1/fleet")
    for gpu_type, totals in fleet["gpu_types"].items():
        prometheus.eventually(f'fairgang_gpus_capacity{{gpu_type="{gpu_type}"}}', totals["total"])
        prometheus.eventually(f'sum(fairgang_gpus{{gpu_type="{gpu_type}"}})', totals["total"])
        prometheus.eventually(f'fairgang_gpus{{gpu_type="{gpu_type}", state="allocated"}}', totals["used"])
    assert fleet["gpu_types"]["H100-80GB"]["used"] == 2
    prometheus.eventually('fairgang_nodes{state="CORDONED"}', 1)

    queue = get(platform, "/v1/queue")
    assert [q["job"]["id"] for q in queue] == [waiting["id"]]
    prometheus.eventually('fairgang_queue_length{tenant="alpha", gpu_type="H100-80GB", size_class="9-32"}', 1)
    prometheus.eventually("sum(fairgang_queue_length)", len(queue))

    for tenant in get(platform, "/v1/tenants"):
        for gpu_type, quota in tenant["quotas"].items():
            labels = f'tenant="{tenant["name"]}", gpu_type="{gpu_type}"'
            prometheus.eventually(f"fairgang_tenant_used_gpus{{{labels}}}", quota["used"])
            prometheus.eventually(f"fairgang_tenant_guaranteed_gpus{{{labels}}}", quota["guaranteed"])

    cordons = [e for e in get(platform, "/v1/health/events") if e["kind"] == "cordon"]
    prometheus.eventually('fairgang_health_events_total{kind="cordon"}', len(cordons))

    # The placement service's own metrics, from its port.
    prometheus.eventually('fairgang_scheduler_leader{job="fairgang-scheduler"}', 1)
    cycles = prometheus.value("fairgang_scheduling_cycle_seconds_count")
    assert cycles is not None and cycles > 0

    # Every query of the Grafana dashboard is valid PromQL over these metrics.
    dashboard = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "fairgang.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$gpu_type", ".*").replace("$tenant", ".*")
            prometheus.query(expr)
