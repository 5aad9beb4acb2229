"""Limits the API applies before any route runs: the size of a request body, and failed authentication.

- **Body size** (:class:`BodySizeLimit`, ``FAIRGANG_API_MAX_BODY_BYTES``): a body over the cap is
  answered 413 before it is read and before the caller is authenticated — at once from its
  ``Content-Length``, or as soon as a body without one (chunked) grows past the cap.
- **Failed authentication** (:class:`AuthThrottle`, ``FAIRGANG_AUTH_FAILURES_PER_MINUTE``): a client
  (by address) whose bearer tokens were refused that many times in the last minute is answered 429
  with ``Retry-After`` until the oldest of those failures is a minute old, without its token being
  looked up. Valid tokens never count.

- **Submission rate** (:class:`SubmissionBuckets`): a tenant's job submissions draw from a token bucket
  of its policy (``submissions_per_minute``, ``submission_burst``); an empty bucket is answered 429 with
  ``Retry-After``. Each API process keeps its own buckets: with N processes (``fairgang api
  --workers N``) a tenant may submit up to N times its rate.

- **Query parameters** (:func:`known_query_only`): a parameter the route does not declare is answered 422
  with its name, never silently ignored (a misspelt filter would otherwise return everything).

All answer with a problem details body (RFC 9457): ``type``, ``title``, ``status``, ``detail``.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any, get_args, get_origin

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Failures are counted over this window.
AUTH_WINDOW_S = 60.0


PROBLEM_JSON = "application/problem+json"


def problem(status: int, detail: str, **extra: Any) -> dict[str, Any]:
    """An RFC 9457 problem details body."""
    return {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status, "detail": detail, **extra}


async def send_problem(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(problem(status, detail)).encode()
    raw = [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """ASGI middleware: request bodies over ``max_bytes`` are answered 413 and never read in full."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _detail(self) -> str:
        return f"the request body is over the API's limit of {self.max_bytes} bytes"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers") or []:
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    await send_problem(send, 400, f"Content-Length is not a number: {value[:40]!r}")
                    return
                if length > self.max_bytes:
                    await send_problem(send, 413, self._detail())
                    return
        received = 0
        started = answered = False

        async def limited_receive() -> Message:
            # Past the cap the caller is answered 413 here, and the app sees the client go away: whatever
            # it answers then (FastAPI: 400 for a body it could not read) is dropped.
            nonlocal received, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    if not started:
                        await send_problem(send, 413, self._detail())
                    answered = True
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if answered:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, tracking_send)


class SubmissionBuckets:
    """Per tenant: a token bucket (tokens, last refill), refilled at the tenant's rate up to its burst."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, tenant: str, per_minute: float, burst: int) -> int | None:
        """Take one submission's token; None when taken, else the seconds until one is there."""
        now = self.clock()
        tokens, at = self._buckets.get(tenant, (float(burst), now))
        tokens = min(float(burst), tokens + (now - at) * per_minute / 60.0)
        if tokens >= 1.0:
            self._buckets[tenant] = (tokens - 1.0, now)
            return None
        self._buckets[tenant] = (tokens, now)
        return max(1, math.ceil((1.0 - tokens) * 60.0 / per_minute))


class AuthThrottle:
    """Per client address: the times of its refused tokens in the last minute (one API process's view)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.clock = clock
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client)
        if times is None:
            return deque()
        while times and times[0] <= now - AUTH_WINDOW_S:
            times.popleft()
        if not times:
            del self._failures[client]
        return times

    def retry_after(self, client: str) -> int | None:
        """Seconds until this client may try a token again; None when it may now."""
        if self.per_minute <= 0:
            return None
        now = self.clock()
        times = self._recent(client, now)
        if len(times) < self.per_minute:
            return None
        return max(1, math.ceil(times[-self.per_minute] + AUTH_WINDOW_S - now))

    def failed(self, client: str) -> None:
        now = self.clock()
        times = self._recent(client, now)
        times.append(now)
        self._failures[client] = times
        while len(times) > max(self.per_minute, 1):
            times.popleft()


def _many(annotation: Any) -> bool:
    """Does the annotation take several values (a list, tuple, set, in a union or not)?"""
    origin = get_origin(annotation)
    if origin in (list, tuple, set, frozenset):
        return True
    return any(_many(arg) for arg in get_args(annotation)) if origin is not None else False


def _query_params(dependant: Dependant) -> dict[str, bool]:
    """Query parameter name -> whether it takes several values, for the route and its dependencies."""
    params = {p.alias: _many(p.field_info.annotation) for p in dependant.query_params}
    for sub in dependant.dependencies:
        params |= _query_params(sub)
    return params


_KNOWN_QUERY: dict[int, dict[str, bool]] = {}


def _declared_query(route: APIRoute) -> dict[str, bool]:
    known = _KNOWN_QUERY.get(id(route))
    if known is None:
        known = _KNOWN_QUERY[id(route)] = _query_params(route.dependant)
    return known


async def known_query_only(request: Request) -> None:
    """An app-wide dependency: refuse (422, each named) query parameters the route does not declare, and a
    parameter of one value given more than once (never silently the last of them)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    declared = _declared_query(route)
    problems = [
        {"loc": ("query", name), "msg": "unknown query parameter", "type": "extra_forbidden"}
        for name in sorted(set(request.query_params) - set(declared))
    ]
    problems += [
        {"loc": ("query", name), "msg": "given more than once; it takes one value", "type": "too_many"}
        for name in sorted(set(request.query_params) & set(declared))
        if not declared[name] and len(request.query_params.getlist(name)) > 1
    ]
    if problems:
        raise RequestValidationError(problems)
