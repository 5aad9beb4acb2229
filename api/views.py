"""The heavy views (fleet, tenants, the queue with its estimates, metrics), computed by a background refresher.

Each API process has one refresher: a thread with its own event loop and its own store
connections, so that reading thousands of rows and simulating the queue forward never run
on the loop that answers heartbeats and submissions. It computes a view when a request asks
for it, again whenever the store's version moves (``repo.view_version``: the change feed and
the newest job and health events) and at least every ``MAX_AGE_S`` while anyone asks; a view
nobody asked for in ``IDLE_S`` is no longer refreshed, and with none the thread ends.

Handlers answer from the cache, already encoded, and filter it per caller at answer time, so
any number of dashboard tabs and scrapers cost what one does. Each view is stamped with the
time its computation ended (``computed_at``, also the ``X-Computed-At`` header), and:

- the first request for a view waits (up to ``FIRST_WAIT_S``) for the one computation in flight;
- after a change of the store, a view that is cheap to compute (under ``QUICK_CPU_S`` of CPU
  last time, one-time costs aside: a small fleet) is recomputed before the request is answered (up to
  ``FRESH_WAIT_S``), so that a client reads its own writes; a costlier one is answered from
  the cache while the refresher recomputes it;
- the refresher spends at most about half its time on one view: a computation that took
  ``t`` seconds is not started again within ``t`` seconds of its end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import multiprocessing
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from api import insight
from api.schemas import JobPublic, QueueEntry
from fairgang.settings import Settings
from scheduler.core import Snapshot
from store import repo
from store.db import Database
from store.models import Job

log = logging.getLogger("fairgang.api.views")

#: A view is recomputed when the store's version moves, and at least this often while it is asked for.
MAX_AGE_S = 5.0
#: A view whose last computation cost less CPU than this is recomputed for a request after a change.
QUICK_CPU_S = 0.1
#: A first computation that cost less CPU than this is repeated at once to learn the view's steady cost.
CALIBRATE_CPU_S = 1.0
#: How long a request waits for a view's first computation.
FIRST_WAIT_S = 120.0
#: How long a request waits for a cheap view's recomputation before it is answered the older one.
FRESH_WAIT_S = 5.0
#: A view whose computation took t seconds is not started again within REST_FACTOR * t seconds of its end.
REST_FACTOR = 2.0
#: A forward simulation of the queue that cost more CPU than this runs in a worker process next time.
PROCESS_CPU_S = 0.5
#: How often the refresher looks at the store's version while views are asked for.
POLL_S = 0.5
#: A view nobody asked for within this long is no longer refreshed; with none left, the refresher ends.
IDLE_S = 60.0

Key = tuple[int, ...]


class ViewUnavailable(Exception):
    """The view has not been computed yet (its first computation failed or is still running)."""


@dataclass(frozen=True)
class View:
    """One computed view: its value, its answer already encoded, and when and at what cost it was computed."""

    name: str
    key: Key
    value: Any
    #: The whole answer (JSON or Prometheus text).
    body: bytes
    #: When the computation ended (UNIX seconds).
    computed_at: float
    #: CPU seconds and wall seconds the computation took.
    cpu_s: float
    wall_s: float
    #: Per-caller parts of the answer (tenant name -> encoded rows), for views a tenant sees only part of.
    parts: dict[str, list[bytes]] = field(default_factory=dict)

    def covers(self, key: Key) -> bool:
        """Whether this view reflects the store at ``key`` (or later) and is not too old."""
        return all(a >= b for a, b in zip(self.key, key, strict=True)) and time.time() - self.computed_at < MAX_AGE_S

    def headers(self) -> dict[str, str]:
        return {"X-Computed-At": repr(self.computed_at), "Cache-Control": "no-store"}


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def json_list(items: Sequence[bytes]) -> bytes:
    """A JSON array of already encoded items."""
    return b"[" + b",".join(items) + b"]"


class Round:
    """One pass of the refresher: the store read once at one version, shared by the views computed in it."""

    def __init__(self, views: ViewCache, db: Database, key: Key, now: float) -> None:
        self.views, self.db, self.key, self.now = views, db, key, now
        self._parts: dict[str, Any] = {}

    async def part(self, name: str, make: Callable[[], Awaitable[Any]]) -> Any:
        if name not in self._parts:
            self._parts[name] = await make()
        return self._parts[name]

    async def snapshot(self) -> Snapshot:
        snapshot: Snapshot = await self.part("snapshot", lambda: insight.snapshot_now(self.db, self.views.settings, self.now))
        return snapshot

    async def queued(self) -> Sequence[Job]:
        queued: Sequence[Job] = await self.part("queued", lambda: repo.queued_jobs(self.db))
        return queued

    async def view(self, name: str) -> View:
        """A view at this round's version: the cached one if it covers it, else computed (and published) now."""
        cached = self.views.cached(name)
        if cached is not None and cached.covers(self.key):
            return cached
        return await self.views.compute(name, self)

    async def value(self, name: str) -> Any:
        return (await self.view(name)).value


# ---------------------------------------------------------------- the views


async def _fleet(r: Round) -> tuple[Any, Callable[[float], tuple[bytes, dict[str, list[bytes]]]]]:
    fleet = await insight.fleet_view(r.db, r.views.settings, now=r.now)
    return fleet, lambda at: (_json({**fleet, "computed_at": at}), {})


async def _tenants(r: Round) -> tuple[Any, Callable[[float], tuple[bytes, dict[str, list[bytes]]]]]:
    tenants = insight.tenant_usage_of(await r.snapshot(), r.views.settings, r.now)

    def encode(_at: float) -> tuple[bytes, dict[str, list[bytes]]]:
        rows = {t["name"]: [_json(t)] for t in tenants}
        return json_list([row for t in tenants for row in rows[t["name"]]]), rows

    return tenants, encode


@dataclass(frozen=True)
class QueueState:
    """The queue view: positions and estimates, and the queued jobs in that order."""

    view: insight.QueueView
    #: (tenant, encoded QueueEntry) in queue order, positions global.
    entries: tuple[tuple[str, bytes], ...]


async def _queue(r: Round) -> tuple[Any, Callable[[float], tuple[bytes, dict[str, list[bytes]]]]]:
    snapshot = await r.snapshot()
    names = await repo.job_names(r.db, [j.id for j in snapshot.pending] + [x.id for x in snapshot.running])
    learned = insight.learned_runtimes(await repo.finished_runtimes(r.db))
    view = await r.views.estimate(snapshot, names, learned, r.now)
    position = view.position
    jobs = sorted(await r.queued(), key=lambda j: (position.get(j.id, len(position) + 1), j.queued_at, j.id))
    entries = tuple(
        (j.tenant, QueueEntry(position=pos, job=JobPublic.of(j), estimated_start=view.estimated_start.get(j.id)).model_dump_json().encode())
        for pos, j in enumerate(jobs, start=1)
    )
    state = QueueState(view=view, entries=entries)

    def encode(_at: float) -> tuple[bytes, dict[str, list[bytes]]]:
        parts: dict[str, list[bytes]] = {}
        for tenant, row in entries:
            parts.setdefault(tenant, []).append(row)
        return json_list([row for _, row in entries]), parts

    return state, encode


async def _metrics(r: Round) -> tuple[Any, Callable[[float], tuple[bytes, dict[str, list[bytes]]]]]:
    from api import metrics  # here: api.metrics answers from this module

    fleet = await r.value("fleet")
    tenants = await r.value("tenants")
    families = await metrics.collect(r.db, r.views.settings, now=r.now, fleet=fleet, tenants=tenants, queued=await r.queued())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.Families(families))
    body = generate_latest(registry)
    return families, lambda _at: (body, {})


COMPUTE: dict[str, Callable[[Round], Awaitable[tuple[Any, Callable[[float], tuple[bytes, dict[str, list[bytes]]]]]]]] = {
    "fleet": _fleet,
    "tenants": _tenants,
    "metrics": _metrics,
    "queue": _queue,
}
#: The order the refresher computes them in: the forward simulation, the costliest, last.
ORDER = ("fleet", "tenants", "metrics", "queue")


# ---------------------------------------------------------------- the cache and its refresher


class ViewCache:
    """The views of one API process, and the refresher thread that computes them (started on first use)."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings, self.url = settings, url
        self._lock = threading.Lock()
        self._views: dict[str, View] = {}
        self._asked: dict[str, float] = {}
        #: name -> the store version a waiting request needs (it is recomputed even within its rest period).
        self._wanted: dict[str, Key] = {}
        #: name -> (when, why) of the last failed computation (cleared by a successful one).
        self._failed: dict[str, tuple[float, str]] = {}
        #: The loop of the latest request: when it is closed (an app in a test went away) the refresher ends.
        self._client: asyncio.AbstractEventLoop | None = None
        self._not_before: dict[str, float] = {}
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stop = False
        #: How many times each view was computed (for tests and the benchmark).
        self.computations: dict[str, int] = {}
        #: The last forward simulation's CPU seconds, and the worker process that runs costly ones.
        self._simulation_cpu_s = 0.0
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        #: CPU seconds spent in the worker process, counted into the cost of the views that used it.
        self._worker_cpu_s = 0.0

    # -- the API's side

    def cached(self, name: str) -> View | None:
        with self._lock:
            return self._views.get(name)

    async def get(self, name: str, db: Database) -> View:
        """The view, as fresh as the rules above give it; raises ViewUnavailable when none could be had in time."""
        key = await repo.view_version(db)
        asked = time.monotonic()
        loop = asyncio.get_running_loop()
        with self._lock:
            self._asked[name], self._client = asked, loop
            view = self._views.get(name)
        if view is not None and view.covers(key):
            return view
        if view is None:
            wait = FIRST_WAIT_S
        elif view.cpu_s < QUICK_CPU_S:
            wait = FRESH_WAIT_S
        else:
            self._request(name, None)
            return view
        self._request(name, key)
        deadline = asked + wait
        while True:
            future: asyncio.Future[None] = loop.create_future()
            with self._lock:
                self._waiters.append((loop, future))
                current, failed = self._views.get(name), self._failed.get(name)
            failed_now = failed is not None and failed[0] >= asked
            if current is not None and (current.covers(key) or failed_now):
                return current
            if failed is not None and failed_now:
                raise ViewUnavailable(f"the {name} view could not be computed: {failed[1]}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if current is not None:
                    return current
                raise ViewUnavailable(f"the {name} view is still being computed; try again")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(future, remaining)

    def _request(self, name: str, key: Key | None) -> None:
        with self._lock:
            if key is not None:
                wanted = self._wanted.get(name)
                self._wanted[name] = key if wanted is None else tuple(max(a, b) for a, b in zip(wanted, key, strict=True))
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(target=self._run, name="fairgang-views", daemon=True)
                self._thread.start()
                return
            loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # its loop just ended: the next request starts another
                loop.call_soon_threadsafe(wake.set)

    def close(self) -> None:
        """Stop the refresher (it ends after its current computation) and its worker process."""
        with self._lock:
            self._stop = True
            thread, loop, wake = self._thread, self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)
        if thread is not None:
            thread.join(timeout=10)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    async def estimate(
        self, snapshot: Snapshot, names: dict[str, tuple[str, str]], learned: dict[tuple[str, str], float], now: float
    ) -> insight.QueueView:
        """The forward simulation: in the refresher's thread while it is cheap, else in a worker process.

        Pure Python for seconds at scale: in a thread it would hold the interpreter lock against
        the API's loop in the same process; a worker process runs it on its own.
        """
        if self._simulation_cpu_s < PROCESS_CPU_S:
            cpu = time.thread_time()
            view = insight.estimate_queue(snapshot, names, learned, now)
            self._simulation_cpu_s = time.thread_time() - cpu
            return view
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        view, self._simulation_cpu_s = await asyncio.get_running_loop().run_in_executor(
            self._pool, _estimate_in_worker, snapshot, names, learned, now
        )
        self._worker_cpu_s += self._simulation_cpu_s
        return view

    def _notify(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that request's loop is gone
                loop.call_soon_threadsafe(_settle, future)

    # -- the refresher's side

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:  # the next request starts a new refresher
            log.exception("view refresher stopped")
            with self._lock:
                self._thread = None

    async def _main(self) -> None:
        db = Database(self.url, **({} if self.url.startswith("sqlite") else {"pool_size": 2}))
        wake = asyncio.Event()
        wake.set()
        with self._lock:
            self._loop, self._wake = asyncio.get_running_loop(), wake
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), POLL_S)
                wake.clear()
                now_m = time.monotonic()
                with self._lock:
                    asked = [n for n in ORDER if now_m - self._asked.get(n, -IDLE_S) < IDLE_S or n in self._wanted]
                    gone = self._client is not None and self._client.is_closed()
                    if self._stop or gone or not asked:
                        self._thread = self._loop = self._wake = None
                        return
                try:
                    key = await repo.view_version(db)
                except Exception as err:  # noqa: BLE001 - the store is unreachable for now
                    log.warning("views: cannot read the store's version: %s", err)
                    await asyncio.sleep(POLL_S)
                    continue
                pass_ = Round(self, db, key, time.time())
                for name in asked:
                    with self._lock:
                        view, wanted = self._views.get(name), self._wanted.get(name)
                        resting = time.monotonic() < self._not_before.get(name, 0.0)
                    if view is not None and view.covers(key) and (wanted is None or view.covers(wanted)):
                        with self._lock:
                            self._wanted.pop(name, None)
                        continue
                    if resting and wanted is None:
                        continue
                    try:
                        view = await pass_.view(name)
                        if self.computations.get(name) == 1 and view.cpu_s < CALIBRATE_CPU_S:
                            # A first computation includes one-time costs (connections, compiling the queries):
                            # repeat a cheap one at once, so that the cost the rules go by is its steady one.
                            await self.compute(name, Round(self, db, key, time.time()))
                    except Exception as err:  # kept for the waiting requests; retried next pass
                        log.exception("views: computing %s failed", name)
                        with self._lock:
                            self._failed[name] = (time.monotonic(), str(err) or type(err).__name__)
                            self._wanted.pop(name, None)
                        self._notify()
        finally:
            await db.dispose()

    async def compute(self, name: str, pass_: Round) -> View:
        """Compute one view in the refresher and publish it, stamped when its computation ended."""
        cpu, wall, worker = time.thread_time(), time.perf_counter(), self._worker_cpu_s
        value, encode = await COMPUTE[name](pass_)
        computed_at = time.time()
        body, parts = encode(computed_at)
        view = View(
            name=name,
            key=pass_.key,
            value=value,
            body=body,
            parts=parts,
            computed_at=computed_at,
            cpu_s=time.thread_time() - cpu + self._worker_cpu_s - worker,
            wall_s=time.perf_counter() - wall,
        )
        with self._lock:
            self._views[name] = view
            self._failed.pop(name, None)
            self.computations[name] = self.computations.get(name, 0) + 1
            self._not_before[name] = time.monotonic() + REST_FACTOR * view.wall_s
            wanted = self._wanted.get(name)
            if wanted is not None and all(a >= b for a, b in zip(pass_.key, wanted, strict=True)):
                del self._wanted[name]
        self._notify()
        return view


def _estimate_in_worker(
    snapshot: Snapshot, names: dict[str, tuple[str, str]], learned: dict[tuple[str, str], float], now: float
) -> tuple[insight.QueueView, float]:
    cpu = time.process_time()
    view = insight.estimate_queue(snapshot, names, learned, now)
    return view, time.process_time() - cpu


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
