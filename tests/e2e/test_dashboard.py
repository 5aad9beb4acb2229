"""The web dashboard on the real platform, rendered by headless Chromium: what the page shows matches the API (SPEC R7)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any

import pytest

from tests.e2e.conftest import Platform, job_spec

# Rendering is what is tested here, not the store: one backend is enough.
pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("platform_factory", ["sqlite"], indirect=True)]

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=15000",
    "--dump-dom",
]
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
SLEEP = "import time; time.sleep(600)"


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.texts).strip()

    def walk(self) -> list[Element]:
        out = [self]
        for child in self.children:
            out += child.walk()
        return out

    def find(self, tag: str | None = None, **attrs: str) -> list[Element]:
        """Elements (of this tag) with these attribute values; ``data_job_id`` stands for ``data-job-id``."""
        found = [e for e in self.walk() if all(e.attrs.get(k.replace("_", "-")) == v for k, v in attrs.items())]
        return [e for e in found if tag is None or e.tag == tag]

    def fields(self) -> dict[str, str]:
        return {e.attrs["data-field"]: e.text for e in self.walk() if "data-field" in e.attrs}


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(element)
        if tag not in VOID:
            self.stack.append(element)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        for element in self.stack:  # every open element's text includes its descendants'
            element.texts.append(data)


def render(url: str) -> Element:
    """The page's DOM after its scripts ran, from headless Chromium; skips the test when Chromium cannot run here."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        reason = "chromium is not installed (apt-get install -y chromium)"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    with tempfile.TemporaryDirectory() as profile:
        try:
            out = subprocess.run(
                [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", url], capture_output=True, text=True, timeout=120
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            pytest.skip(f"chromium could not run: {err}")
    if "<html" not in out.stdout:
        reason = f"chromium rendered nothing (exit {out.returncode}): {out.stderr.strip()[-500:]}"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    parser = _Parser()
    parser.feed(out.stdout)
    return parser.root


def get(platform: Platform, path: str, token: str = "admin-token") -> Any:
    with platform.client(token) as http:
        resp = http.get(path)
        assert resp.status_code == 200, resp.text
        return resp.json()


def wait_until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_dashboard_shows_what_the_api_says(platform: Platform) -> None:
    # A non-preemptible 16-GPU job takes every H100; a one-GPU job queues behind it.
    big = platform.submit(job_spec("dash-big", SLEEP, gpu_count=16, preemptible=False))
    platform.wait_for(big["id"], {"RUNNING"})
    waiting = platform.submit(job_spec("dash-waiting", SLEEP))
    wait_until("a pending reason", lambda: platform.job(waiting["id"])["pending_reason"])
    # One preemption by hand (an L40S job that stops at once on SIGTERM), and a cordon for the health events.
    moved = platform.submit(job_spec("dash-moved", SLEEP, gpu_type="L40S"))
    platform.wait_for(moved["id"], {"RUNNING"})
    with platform.client("admin-token") as http:
        assert http.post(f"/v1/jobs/{moved['id']}/preempt").status_code == 200
        wait_until("the requeued job running again", lambda: platform.job(moved["id"])["attempt"] == 2)
        platform.wait_for(moved["id"], {"RUNNING"})
        assert http.post("/v1/nodes/h1/cordon").status_code == 200

    dom = render(f"{platform.api_url}/dashboard#token=admin-token")
    fleet, queue, tenants = get(platform, "/v1/fleet"), get(platform, "/v1/queue"), get(platform, "/v1/tenants")
    status = dom.find(id="status")[0]
    assert status.attrs["data-state"] == "ok", status.text

    for gpu_type, totals in fleet["gpu_types"].items():
        (row,) = dom.find(id="fleet-types")[0].find(data_gpu_type=gpu_type)
        shown = row.fields()
        keys = ("total", "used", "free", "unhealthy")
        assert [int(shown[k]) for k in keys] == [totals[k] for k in keys]
    assert fleet["gpu_types"]["H100-80GB"]["used"] == 16
    (leaf,) = dom.find(id="fleet-domains")[0].find(data_level="leaf", data_domain="l1")
    assert int(leaf.fields()["total"]) == fleet["domains"]["leaf"]["l1"]["total"] == 16

    entry = next(q for q in queue if q["job"]["id"] == waiting["id"])
    (row,) = dom.find(id="queue")[0].find("tr", data_job_id=waiting["id"])
    assert int(row.attrs["data-position"]) == entry["position"] == int(row.fields()["position"])
    assert row.fields()["pending_reason"] == entry["job"]["pending_reason"]
    assert row.fields()["estimated_start"]

    alpha = next(t for t in tenants if t["name"] == "alpha")
    for gpu_type, quota in alpha["quotas"].items():
        (row,) = dom.find(id="tenants")[0].find(data_tenant="alpha", data_gpu_type=gpu_type)
        shown = row.fields()
        assert [int(shown[k]) for k in ("guaranteed", "used", "borrowed")] == [quota[k] for k in ("guaranteed", "used", "borrowed")]
        assert int(shown["waiting"]) == len(alpha["waiting_jobs"])
    assert alpha["quotas"]["H100-80GB"]["borrowed"] == 8

    links = {a.attrs["data-job-id"]: a.attrs["href"] for a in dom.find(id="jobs")[0].walk() if "data-temporal-link" in a.attrs}
    for job in (big, waiting, moved):
        assert links[job["id"]] == platform.job(job["id"])["temporal_url"]
    preemptions = dom.find(id="preemptions")[0]
    assert {r.attrs["data-kind"] for r in preemptions.find("tr", data_job_id=moved["id"])} == {"PREEMPTING", "REQUEUED"}
    assert dom.find(id="health-events")[0].find(data_kind="cordon", data_node_id="h1")
