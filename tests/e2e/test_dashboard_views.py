"""The dashboard says when the server computed each view it shows, and polls without overlapping requests."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.e2e.conftest import Platform
from tests.e2e.test_dashboard import render

pytestmark = [pytest.mark.e2e]

PAGE = Path(__file__).resolve().parents[2] / "api" / "static" / "dashboard.html"


@pytest.mark.parametrize("platform_factory", ["sqlite"], indirect=True)
def test_the_dashboard_shows_when_each_view_was_computed(platform: Platform) -> None:
    dom = render(f"{platform.api_url}/dashboard#token=admin-token")
    assert dom.find(id="status")[0].attrs["data-state"] == "ok"
    with platform.client("admin-token") as http:
        for view, path in (("fleet", "/v1/fleet"), ("queue", "/v1/queue"), ("tenants", "/v1/tenants")):
            (span,) = dom.find(id=f"{view}-as-of")
            shown = float(span.attrs["data-computed-at"])
            assert span.text.startswith("as of ") and span.text.count(":") == 2, span.text
            # What the page showed was the server's stamp: no later than the view the API answers now.
            resp = http.get(path)
            assert resp.status_code == 200
            assert 0 < shown <= float(resp.headers["X-Computed-At"]) <= time.time()


def test_the_dashboard_schedules_each_refresh_when_the_previous_one_ended() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert "setInterval" not in page  # an interval fires whether or not the previous refresh has answered
    assert "setTimeout(() => poll(mine), REFRESH_MS)" in page
