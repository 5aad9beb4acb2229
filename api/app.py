"""The FastAPI application (OpenAPI at /openapi.json, docs at /docs)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from api import accounting, dashboard, eta, fleet, health, jobs, metrics, sweeps, tenants, tokens, whatif
from api.deps import AppState, State, log
from api.limits import PROBLEM_JSON, BodySizeLimit, known_query_only, problem
from api.schemas import ERRORS
from api.views import ViewUnavailable
from fairgang import __version__
from fairgang.settings import Settings
from store.db import Database, store_busy

#: What a 503 for a busy store tells the client to wait, in seconds.
STORE_BUSY_RETRY_S = 2


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        db = Database(settings.database_url, busy_timeout_s=settings.api_store_busy_timeout_s)
        app.state.fairgang = AppState(settings=settings, db=db)
        try:
            yield
        finally:
            await asyncio.to_thread(app.state.fairgang.views.close)
            await db.dispose()

    app = FastAPI(title="fairgang", version=__version__, lifespan=lifespan, responses=ERRORS, dependencies=[Depends(known_query_only)])
    app.add_middleware(BodySizeLimit, max_bytes=settings.api_max_body_bytes)
    app.include_router(jobs.router)
    app.include_router(accounting.router)
    app.include_router(fleet.router)
    app.include_router(sweeps.router)
    app.include_router(tenants.router)
    app.include_router(tokens.router)
    app.include_router(metrics.router)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    app.include_router(whatif.router)
    app.include_router(eta.router)

    @app.exception_handler(StarletteHTTPException)
    async def _refused(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # One error shape (RFC 9457 problem details); a refusal that names fields carries them as ``problems``.
        if isinstance(err.detail, dict):
            body = problem(err.status_code, str(err.detail.get("error", "refused")), problems=err.detail.get("problems", []))
        else:
            body = problem(err.status_code, str(err.detail))
        headers = dict(err.headers or {})
        if err.status_code == 405:  # every method the path serves, not only those of the first route that matched it
            methods = {
                m
                for r in app.router.routes
                if isinstance(r, Route) and r.matches(request.scope)[0] == Match.PARTIAL
                for m in r.methods or ()
            }
            headers["Allow"] = ", ".join(sorted(methods))
        return JSONResponse(body, status_code=err.status_code, headers=headers, media_type=PROBLEM_JSON)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        problems = [{"field": ".".join(str(p) for p in e["loc"] if p != "body") or "(body)", "reason": e["msg"]} for e in err.errors()]
        return JSONResponse(problem(422, "invalid request", problems=problems), status_code=422, media_type=PROBLEM_JSON)

    @app.exception_handler(OperationalError)
    @app.exception_handler(PoolTimeout)
    async def _busy(request: Request, err: Exception) -> JSONResponse:
        if not store_busy(err):
            raise err
        log.warning("store busy on %s %s: %s", request.method, request.url.path, err)
        body = problem(503, "the store is busy (its write lock or its connections): try again shortly")
        return JSONResponse(body, status_code=503, headers={"Retry-After": str(STORE_BUSY_RETRY_S)}, media_type=PROBLEM_JSON)

    @app.exception_handler(ViewUnavailable)
    async def _not_yet(_request: Request, err: ViewUnavailable) -> JSONResponse:
        return JSONResponse(problem(503, str(err)), status_code=503, headers={"Retry-After": "5"}, media_type=PROBLEM_JSON)

    @app.get("/healthz", tags=["health"])
    async def healthz(state: State) -> dict[str, Any]:
        async with state.db.sessions() as session:
            await session.execute(text("SELECT 1"))
        client = await state.temporal()
        return {"ok": True, "store": "ok", "temporal": "ok" if client is not None else "unreachable"}

    return app
