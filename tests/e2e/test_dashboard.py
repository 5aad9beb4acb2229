"""The web dashboard on the real platform, driven in Debian's Chromium through Playwright: what each view shows matches
the API (SPEC R7), and its actions reach the API with the page's token.

Chromium is the system's (``shutil.which("chromium")``), never a browser Playwright downloads; without it the tests
are skipped, saying why. Each test saves screenshots under ``$FAIRGANG_TEST_ARTEFACTS/dashboard`` (by default
``test-artefacts/dashboard`` in the repository, ignored by git; the path is printed).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO, TERMINAL, Platform, job_spec

pytest.importorskip("playwright", reason="playwright is not installed (pip install -e '.[dev]')")
from playwright.sync_api import Browser, Page, expect, sync_playwright

# Rendering is what is tested here, not the store: one backend is enough.
pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("platform_factory", ["sqlite"], indirect=True)]

SLEEP = "import time; time.sleep(600)"
#: Rollup buckets of a few seconds, so the charts have several samples within a test.
ROLLUP_BUCKET_S = "2"


def iso(ts: float | None) -> str:
    """A time as the page writes it: ISO 8601, UTC, to the second."""
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def get(platform: Platform, path: str, token: str = "admin-token", **params: Any) -> Any:
    with platform.client(token) as http:
        resp = http.get(path, params=params)
        assert resp.status_code == 200, resp.text
        return resp.json()


@pytest.fixture(scope="module")
def artefacts() -> Path:
    # Not under pytest's base temporary directory: pytest keeps only the latest three of those, and other runs
    # on the machine would delete the screenshots before anyone looked at them.
    folder = Path(os.environ.get("FAIRGANG_TEST_ARTEFACTS") or REPO / "test-artefacts") / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"dashboard screenshots in {folder}", file=sys.stderr)
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        reason = "chromium is not installed (apt-get install -y chromium)"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        except Exception as err:  # noqa: BLE001 - any failure to start it means it cannot run here
            reason = f"chromium could not start: {err}"
            print(reason, file=sys.stderr)
            pytest.skip(reason)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def dash(platform_factory: Any) -> Platform:
    """One platform for the module, with rollup buckets of a few seconds, and a scene: a 16-GPU job holding every
    H100, a job waiting behind it, an L40S job preempted once and running again, and node h1 cordoned."""
    platform: Platform = platform_factory()
    platform.extra_env["FAIRGANG_ROLLUP_BUCKET_S"] = ROLLUP_BUCKET_S
    platform.start()
    big = platform.submit(job_spec("dash-big", SLEEP, gpu_count=16, preemptible=False))
    platform.wait_for(big["id"], {"RUNNING"})
    waiting = platform.submit(job_spec("dash-waiting", SLEEP))
    wait_until("a pending reason", lambda: platform.job(waiting["id"])["pending_reason"])
    moved = platform.submit(job_spec("dash-moved", SLEEP, gpu_type="L40S"))
    platform.wait_for(moved["id"], {"RUNNING"})
    with platform.client("admin-token") as http:
        assert http.post(f"/v1/jobs/{moved['id']}/preempt").status_code == 200
        wait_until("the requeued job running again", lambda: platform.job(moved["id"])["attempt"] == 2)
        platform.wait_for(moved["id"], {"RUNNING"})
        assert http.post("/v1/nodes/h1/cordon").status_code == 200
    platform.scene = {"big": big, "waiting": waiting, "moved": moved}  # type: ignore[attr-defined]
    return platform


def open_page(browser: Browser, url: str) -> Page:
    page = browser.new_context(viewport={"width": 1600, "height": 1000}).new_page()
    page.goto(url)
    return page


def loaded(page: Page) -> None:
    """Wait for the page's refresh to have answered (the status says "live")."""
    expect(page.locator("#status")).to_have_attribute("data-state", "ok", timeout=30_000)


def fields(row: Any) -> dict[str, str]:
    """The texts of a row's (or a list's) ``data-field`` cells."""
    return dict(row.evaluate("r => Array.from(r.querySelectorAll('[data-field]')).map(e => [e.dataset.field, e.textContent.trim()])"))


def confirm(page: Page, button: Any) -> None:
    """Click an action and say yes in its confirmation dialog."""
    button.click()
    dialog = page.locator("dialog#confirm")
    expect(dialog).to_be_visible()
    dialog.locator("#confirm-yes").click()
    expect(dialog).to_be_hidden()


def test_the_token_prompt_shows_when_no_token_is_given(dash: Platform, browser: Browser, artefacts: Path) -> None:
    page = open_page(browser, f"{dash.api_url}/dashboard")
    prompt = page.locator("#token-prompt")
    expect(prompt).to_be_visible()
    expect(prompt).to_contain_text("An API token is needed")
    expect(page.locator("#view-overview")).to_be_hidden()
    expect(page.locator("#status")).to_have_text("enter an API token")
    page.screenshot(path=artefacts / "token-prompt.png", full_page=True)
    # A token the API refuses: it says so and asks again.
    page.fill("#prompt-token", "not-a-token")
    page.locator("#prompt-form button").click()
    expect(page.locator("#status")).to_contain_text("401 unknown token")
    expect(prompt).to_be_visible()
    page.fill("#prompt-token", "alpha-token")
    page.locator("#prompt-form button").click()
    loaded(page)
    expect(prompt).to_be_hidden()
    expect(page.locator("#who")).to_have_attribute("data-role", "tenant")
    page.close()


def test_the_overview_and_its_charts_match_the_api(dash: Platform, browser: Browser, artefacts: Path) -> None:
    scene = dash.scene  # type: ignore[attr-defined]
    before = get(dash, "/v1/rollup")["rows"]
    wait_until("three rollup samples", lambda: len(get(dash, "/v1/rollup")["rows"]) >= 3)
    page = open_page(browser, f"{dash.api_url}/dashboard#token=admin-token")
    loaded(page)
    expect(page.locator("#view-overview")).to_be_visible()
    assert "token=" not in page.url  # the token leaves the address bar
    fleet, queue, tenants = get(dash, "/v1/fleet"), get(dash, "/v1/queue"), get(dash, "/v1/tenants")
    # What the charts drew, read at once (the page refreshes every 5 s), then the rows the API has from then on.
    charts = page.evaluate(
        """() => ({
          samples: Number(document.querySelector('#chart-utilisation').dataset.samples),
          utilisation: document.querySelector('#chart-utilisation').dataset.latest,
          queue: document.querySelector('#chart-queue').dataset.latest,
          queue_points: Number(document.querySelector('#chart-queue path[data-series="queued jobs"]').dataset.points),
          p99_paths: document.querySelectorAll('#chart-waits path[data-series="p99"]').length,
        })"""
    )
    after = get(dash, "/v1/rollup")["rows"]

    for gpu_type, totals in fleet["gpu_types"].items():
        shown = fields(page.locator(f'#fleet-types tr[data-gpu-type="{gpu_type}"]'))
        keys = ("total", "used", "free", "unhealthy")
        assert [int(shown[k]) for k in keys] == [totals[k] for k in keys]
    assert fleet["gpu_types"]["H100-80GB"]["used"] == 16
    leaf = fields(page.locator('#fleet-domains tr[data-level="leaf"][data-domain="l1"]'))
    assert int(leaf["total"]) == fleet["domains"]["leaf"]["l1"]["total"]
    assert leaf["fragmentation"] == f"{fleet['domains']['leaf']['l1']['fragmentation'] * 100:.1f}%"

    entry = next(q for q in queue if q["job"]["id"] == scene["waiting"]["id"])
    row = page.locator(f'#queue tr[data-job-id="{scene["waiting"]["id"]}"]')
    assert int(row.get_attribute("data-position") or 0) == entry["position"]
    assert fields(row)["pending_reason"] == entry["job"]["pending_reason"]
    # Its predicted start's interval beside the most likely start, as the page was given them.
    low, eta, high = (row.get_attribute(f"data-eta{end}") for end in ("-low", "", "-high"))
    if eta is not None:  # a start within the horizon has an interval's low end at least
        assert low is not None and float(low) <= float(eta) <= (float(high) if high is not None else float("inf"))
        window = fields(row)["estimated_start_interval"]
        if high is None:
            assert window == f"{iso(float(low))} or later"
        else:
            assert window == (iso(float(low)) if low == high else f"{iso(float(low))} \N{EN DASH} {iso(float(high))}")

    alpha = next(t for t in tenants if t["name"] == "alpha")
    for gpu_type, quota in alpha["quotas"].items():
        shown = fields(page.locator(f'#tenants tr[data-tenant="alpha"][data-gpu-type="{gpu_type}"]'))
        assert [int(shown[k]) for k in ("guaranteed", "used", "borrowed")] == [quota[k] for k in ("guaranteed", "used", "borrowed")]
        assert shown["dominant_share"] == f"{alpha['dominant_share'] * 100:.1f}%"
    for job in scene.values():
        link = page.locator(f'#jobs a[data-temporal-link][data-job-id="{job["id"]}"]')
        assert link.get_attribute("href") == dash.job(job["id"])["temporal_url"]
    kinds = page.locator(f'#preemptions tr[data-job-id="{scene["moved"]["id"]}"]').evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert set(kinds) == {"PREEMPTING", "REQUEUED"}
    assert page.locator('#health-events tr[data-kind="cordon"][data-node-id="h1"]').count() >= 1

    # The server's stamp of each cached view, in ISO 8601: no later than the view the API answers now.
    with dash.client("admin-token") as http:
        for view in ("fleet", "queue", "tenants"):
            span = page.locator(f"#{view}-as-of")
            shown_at = float(span.get_attribute("data-computed-at") or 0)
            assert span.inner_text() == f"as of {iso(shown_at)}"
            assert 0 < shown_at <= float(http.get(f"/v1/{view}").headers["X-Computed-At"]) <= time.time()

    # The charts drew the rollup rows the API had when the page read them: a prefix of those it has now.
    samples = charts["samples"]
    assert len(before) <= samples <= len(after) and samples >= 3
    drawn = after[:samples]
    assert charts["utilisation"] == f"{drawn[-1]['utilisation_pct']:.1f}%"
    assert charts["queue"] == str(drawn[-1]["queue_length"])
    assert charts["queue_points"] == samples
    assert charts["p99_paths"] == (1 if any(r["wait_p99_s"] is not None for r in drawn) else 0)
    assert any(r["utilisation_pct"] >= 80.0 for r in drawn)  # 16 of the 20 GPUs held by the big job
    page.screenshot(path=artefacts / "overview.png", full_page=True)
    page.close()


def test_the_nodes_view_matches_the_api_and_an_admin_cordons_a_node_and_returns_a_gpu(
    dash: Platform, browser: Browser, artefacts: Path
) -> None:
    with dash.client("admin-token") as http:
        assert http.post("/v1/nodes/g1/gpus/3/faults", json={"kind": "xid", "xid": 79}).status_code == 200
    wait_until("g1's GPU 3 unhealthy", lambda: any(not g["healthy"] for n in get(dash, "/v1/fleet")["nodes"] for g in n["gpu_health"]))
    page = open_page(browser, f"{dash.api_url}/dashboard#/nodes?token=admin-token")
    loaded(page)
    expect(page.locator("#view-nodes")).to_be_visible()
    for node in get(dash, "/v1/fleet")["nodes"]:
        row = page.locator(f'#nodes tr[data-node-id="{node["id"]}"]')
        assert row.get_attribute("data-state") == node["state"]
        shown = fields(row)
        assert [int(shown[k]) for k in ("used", "free", "unhealthy")] == [node["gpus"][k] for k in ("used", "free", "unhealthy")]
        assert row.locator("[data-job-link]").evaluate_all("as => [...new Set(as.map(a => a.dataset.jobLink))].sort()") == node["jobs"]
        badges = row.locator(".gpu").evaluate_all(
            "bs => bs.map(b => [Number(b.dataset.gpuIndex), b.dataset.healthy === 'true', b.dataset.jobId])"
        )
        assert badges == [[g["index"], g["healthy"], g["job_id"] or ""] for g in node["gpu_health"]]
        assert (row.get_attribute("data-unhealthy") == "true") == (node["gpus"]["unhealthy"] > 0)
    h1 = page.locator('#nodes tr[data-node-id="h1"]')
    assert "hl-cordoned" in (h1.get_attribute("class") or "")
    g1 = page.locator('#nodes tr[data-node-id="g1"]')
    assert "hl-unhealthy" in (g1.get_attribute("class") or "")
    page.screenshot(path=artefacts / "nodes.png", full_page=True)

    confirm(page, page.locator('#nodes tr[data-node-id="h2"] button[data-action="cordon"]'))
    expect(page.locator('#nodes tr[data-node-id="h2"]')).to_have_attribute("data-state", "CORDONED", timeout=30_000)
    expect(page.locator("#action-result")).to_have_attribute("data-state", "ok")
    assert next(n for n in get(dash, "/v1/fleet")["nodes"] if n["id"] == "h2")["state"] == "CORDONED"

    confirm(page, g1.locator('button[data-action="return-gpu"]'))
    expect(page.locator('#nodes tr[data-node-id="g1"]')).to_have_attribute("data-unhealthy", "false", timeout=30_000)
    assert next(n for n in get(dash, "/v1/fleet")["nodes"] if n["id"] == "g1")["gpus"]["unhealthy"] == 0
    page.screenshot(path=artefacts / "nodes-after-actions.png", full_page=True)
    page.close()
    with dash.client("admin-token") as http:
        assert http.post("/v1/nodes/h2/uncordon").status_code == 200


def test_the_jobs_list_matches_the_api_with_filters_search_and_paging(dash: Platform, browser: Browser, artefacts: Path) -> None:
    # One of them elastic: the list shows its range.
    quick = [
        dash.submit(job_spec(f"listed-{i}", "print('done')", gpu_type="L40S", gpu_count={"min": 1, "max": 2} if i == 0 else 1))
        for i in range(9)
    ]
    for job in quick:
        dash.wait_for(job["id"], TERMINAL, timeout=180)
    page = open_page(browser, f"{dash.api_url}/dashboard#/jobs?token=admin-token")
    loaded(page)

    def shown_ids() -> list[str]:
        ids: list[str] = page.locator("#jobs-list tbody tr[data-job-id]").evaluate_all("rs => rs.map(r => r.dataset.jobId)")
        return ids

    def apply(**values: str) -> None:
        form = page.locator("#jobs-filters")
        for name in ("search", "tenant", "label", "since", "until"):
            form.locator(f'[name="{name}"]').fill(values.get(name, ""))
        form.locator('[name="state"]').select_option(values.get("state", ""))
        form.locator('[name="limit"]').select_option(values.get("limit", "25"))
        form.locator('button[type="submit"]').click()

    every = get(dash, "/v1/jobs", limit=25)
    assert any(j["gpu_max"] == 2 for j in every)
    expect(page.locator("#jobs-list")).to_have_attribute("data-rows", str(len(every)))
    assert shown_ids() == [j["id"] for j in every]
    for job in every:
        shown = fields(page.locator(f'#jobs-list tr[data-job-id="{job["id"]}"]'))
        assert (shown["state"], shown["submitted"], shown["start"], shown["end"]) == (
            job["state"],
            iso(job["created_at"]),
            iso(job["started_at"]),
            iso(job["finished_at"]),
        )
        mul = "\N{MULTIPLICATION SIGN}"
        gpus = f"{job['gpu_count']} {mul} {job['gpu_type']}"
        if job["gpu_max"]:
            gpus = f"{job['gpu_count']}\N{EN DASH}{job['gpu_max']} {mul} {job['gpu_type']} (elastic)"
        assert shown["gpus"] == gpus
        if job["finished_at"] is not None and job["started_at"] is not None:
            hours = (job["finished_at"] - job["started_at"]) * job["gpu_count"] / 3600
            assert shown["gpu_hours"] == f"{hours:.3f}"

    apply(search="LISTED-")
    expect(page.locator("#jobs-list")).to_have_attribute("data-rows", "9")
    assert shown_ids() == [j["id"] for j in get(dash, "/v1/jobs", search="LISTED-", limit=25)]
    apply(state="SUCCEEDED")
    succeeded = get(dash, "/v1/jobs", state="SUCCEEDED", limit=25)
    expect(page.locator("#jobs-list")).to_have_attribute("data-rows", str(len(succeeded)))
    assert shown_ids() == [j["id"] for j in succeeded] and {j["id"] for j in quick} <= set(shown_ids())
    apply(state="RUNNING", search="dash")
    expect(page.locator("#jobs-list")).to_have_attribute("data-rows", str(len(get(dash, "/v1/jobs", state="RUNNING", search="dash"))))

    # Pages of 10: the second is the API's page after the first's cursor; back again gives the first.
    apply(limit="10")
    with dash.client("admin-token") as http:
        first = http.get("/v1/jobs", params={"limit": 10})
        second = http.get("/v1/jobs", params={"limit": 10, "cursor": first.headers["X-Next-Cursor"]}).json()
    expect(page.locator("#jobs-page")).to_have_text("page 1")
    # "page 1" was shown under the previous filter already: wait for this list's rows.
    expect(page.locator("#jobs-list")).to_have_attribute("data-rows", str(len(first.json())))
    assert shown_ids() == [j["id"] for j in first.json()]
    page.locator("#jobs-next").click()
    expect(page.locator("#jobs-page")).to_have_text("page 2")
    expect(page.locator("#jobs-list")).to_have_attribute("data-rows", str(len(second)))
    assert shown_ids() == [j["id"] for j in second]
    page.screenshot(path=artefacts / "jobs-page-2.png", full_page=True)
    page.locator("#jobs-prev").click()
    expect(page.locator("#jobs-page")).to_have_text("page 1")
    expect(page.locator("#jobs-list")).to_have_attribute("data-rows", str(len(first.json())))
    assert shown_ids() == [j["id"] for j in first.json()]
    page.close()


def test_the_job_page_matches_the_api_and_cancel_makes_the_job_cancelled(dash: Platform, browser: Browser, artefacts: Path) -> None:
    scene = dash.scene  # type: ignore[attr-defined]
    victim = dash.submit(job_spec("dash-cancel", "print('hello from the job', flush=True); import time; time.sleep(600)", gpu_type="L40S"))
    dash.wait_for(victim["id"], {"RUNNING"})
    with dash.client("admin-token") as http:
        wait_until("the job's log", lambda: "hello from the job" in http.get(f"/v1/jobs/{victim['id']}/logs").text)
    page = open_page(browser, f"{dash.api_url}/dashboard#/jobs/{victim['id']}?token=alpha-token")
    loaded(page)
    job = dash.job(victim["id"])
    shown = fields(page.locator("#job-fields"))
    assert (shown["id"], shown["state"], shown["attempt"]) == (job["id"], "RUNNING", str(job["attempt"]))
    assert shown["start"] == iso(job["started_at"])
    assert shown["gpus"] == f"{job['gpu_count']} \N{MULTIPLICATION SIGN} {job['gpu_type']}"
    assert page.locator("#job-fields a[data-temporal-link]").get_attribute("href") == job["temporal_url"]
    members = page.locator("#job-allocation tbody tr").evaluate_all("rs => rs.map(r => r.dataset.nodeId)")
    assert members == [m["node_id"] for m in job["allocation"]["members"]]
    attempts = page.locator("#job-attempts tbody tr").evaluate_all("rs => rs.map(r => r.dataset.allocationId)")
    assert attempts == [a["id"] for a in job["allocations"]]
    events = page.locator("#job-events tbody tr").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert events == [e["kind"] for e in job["events"]]
    assert "hello from the job" in page.locator("#job-log").inner_text()
    assert '"name": "dash-cancel"' in page.locator("#job-spec").inner_text()
    page.screenshot(path=artefacts / "job-running.png", full_page=True)

    confirm(page, page.locator('#job-actions button[data-action="cancel"]'))
    expect(page.locator("#view-job")).to_have_attribute("data-state", "CANCELLED", timeout=60_000)
    expect(page.locator('#job-fields [data-field="state"]')).to_have_text("CANCELLED")
    assert dash.job(victim["id"])["state"] == "CANCELLED"
    page.screenshot(path=artefacts / "job-cancelled.png", full_page=True)

    # A waiting job's page: why it waits, its place in the queue and when it should start.
    page.goto(f"{dash.api_url}/dashboard#/jobs/{scene['waiting']['id']}")
    expect(page.locator("#view-job")).to_have_attribute("data-job-id", scene["waiting"]["id"], timeout=30_000)
    waiting = dash.job(scene["waiting"]["id"])
    shown = fields(page.locator("#job-fields"))
    assert shown["pending_reason"] == waiting["pending_reason"] and shown["queue_position"] == str(waiting["queue_position"])
    if waiting["estimated_start"] is None:
        assert shown["estimated_start"] == "beyond the horizon"
    else:
        assert shown["estimated_start"].startswith("in ") and shown["estimated_start"].endswith("Z)")
        assert shown["estimated_start_interval"].endswith("Z") or shown["estimated_start_interval"].endswith("or later")
    page.close()


def test_a_tenant_token_gets_no_admin_actions_and_sees_the_apis_refusal(dash: Platform, browser: Browser, artefacts: Path) -> None:
    page = open_page(browser, f"{dash.api_url}/dashboard#/nodes?token=beta-token")
    loaded(page)
    expect(page.locator("#who")).to_have_text("tenant of beta")
    assert page.locator("#nodes tbody tr[data-node-id]").count() == len(get(dash, "/v1/fleet")["nodes"])
    assert page.locator("#nodes button[data-action]").count() == 0
    # Had it an admin action to press (a page left open while the token changed), the API's 403 is what it shows.
    page.evaluate("() => { act('Cordon h2?', '/v1/nodes/h2/cordon', 'cordoned'); }")  # not awaited: the dialog waits for a click
    page.locator("dialog#confirm #confirm-yes").click()
    expect(page.locator("#action-result")).to_have_attribute("data-state", "error")
    expect(page.locator("#action-result")).to_contain_text("403 this endpoint is for admins")
    assert next(n for n in get(dash, "/v1/fleet")["nodes"] if n["id"] == "h2")["state"] == "READY"
    page.screenshot(path=artefacts / "tenant-nodes.png", full_page=True)
    page.close()


def test_the_overview_shows_the_accuracy_of_the_estimated_starts(dash: Platform, browser: Browser, artefacts: Path) -> None:
    # (Last: it ends the scene.) The waiting job's start was estimated while it waited (the overview asked for the
    # queue); the big job ends, the waiting one starts, and the queue view scores its estimate.
    scene = dash.scene  # type: ignore[attr-defined]
    waiting = scene["waiting"]["id"]
    wait_until("the waiting job estimated", lambda: any(q["job"]["id"] == waiting and q["estimated_start"] for q in get(dash, "/v1/queue")))
    with dash.client("admin-token") as http:
        assert http.post(f"/v1/jobs/{scene['big']['id']}/cancel").status_code == 200
    dash.wait_for(waiting, {"RUNNING"})

    def scored() -> dict[str, Any] | None:
        get(dash, "/v1/queue")  # the queue view scores what started since
        groups = get(dash, "/v1/eta-accuracy", token="alpha-token")["groups"]
        return next((g for g in groups if (g["gpu_type"], g["size_class"]) == ("H100-80GB", "1") and g["scored"] >= 1), None)

    group = wait_until("the waiting job's estimate scored", scored)
    page = open_page(browser, f"{dash.api_url}/dashboard#token=alpha-token")
    loaded(page)
    row = page.locator('#eta-accuracy tr[data-gpu-type="H100-80GB"][data-size-class="1"]')
    expect(row).to_have_count(1)
    shown = fields(row)
    assert (shown["gpu_type"], shown["size_class"], int(shown["scored"])) == ("H100-80GB", "1", group["scored"])
    for key in ("coverage", "within_10min", "within_1h"):
        assert shown[key] == f"{group[key] * 100:.1f}%"
    assert shown["median_abs_error"].endswith("s") and shown["median_signed_error"][0] in "+0\N{MINUS SIGN}"
    assert page.locator('#eta-accuracy tr[data-gpu-type="*"]').count() == 1  # and all of them together
    page.screenshot(path=artefacts / "eta-accuracy.png", full_page=True)
    page.close()
