"""GET /dashboard: a web page over the JSON API, nothing to build.

The page (``api/static/dashboard.html``) is static HTML and vanilla JavaScript with views routed on its URL
fragment: the overview (24-hour charts from ``/v1/rollup``, fleet, queue, tenants, preemptions, health events),
the nodes, the jobs list and one job, with confirmed actions (cancel, preempt; for admins cordon, drain, return a
GPU). It reads the same endpoints as the CLI with a bearer token from the URL fragment (``/dashboard#token=...``,
never sent to the server) or a field, kept in the tab's sessionStorage. The page itself holds no data, so it is
served without authentication; the only value filled in here is the Temporal UI's address for the links to each
job's workflow."""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from api.deps import State
from api.jobs import temporal_workflows_url

router = APIRouter(tags=["dashboard"])

PAGE = Path(__file__).resolve().parent / "static" / "dashboard.html"


@cache
def _template() -> str:
    return PAGE.read_text(encoding="utf-8")


@router.get("/dashboard", response_class=HTMLResponse)
async def dashboard(state: State) -> HTMLResponse:
    """The dashboard page; open it as ``/dashboard#token=YOUR_TOKEN``."""
    page = _template().replace("__TEMPORAL_WORKFLOWS_URL__", html.escape(temporal_workflows_url(state.settings), quote=True))
    return HTMLResponse(page, headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"})
