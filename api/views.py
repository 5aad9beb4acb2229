"""The heavy views (fleet, tenants, the queue with its estimates, metrics), computed by a view worker process.

Each API process has one view worker: a child process (``python -c 'from api.views import
worker_main; ...'``) with its own event loop and store connections, so that reading thousands
of rows, simulating the queue forward and encoding megabytes of JSON never run in the API's
interpreter (not even in a thread, where they would hold its lock against the loop that
answers heartbeats and submissions). The worker computes a view when a request asks for it,
again whenever the store's version moves (``store.observability.view_version``: the change feed and the
newest job and health events) and at least every ``MAX_AGE_S`` while anyone asks; a view
nobody asked for in ``IDLE_S`` is no longer refreshed. It keeps what it read between
computations (the scheduler's ``SnapshotReader``, with its run-time predictor, refreshed at every
read), so a recomputation after a change reads narrow rows and decodes only the jobs, allocations and
successful runs that are new.

It sends each view to the API process already encoded (the whole answer, and the per-caller
parts: a tenant's rows), over a pipe that a thread of the API process reads; handlers answer
from that cache and filter it per caller at answer time, so any number of dashboard tabs and
scrapers cost what one does. Each view is stamped with the time its computation ended
(``computed_at``, also the ``X-Computed-At`` header), and:

- the first request for a view waits (up to ``FIRST_WAIT_S``) for the one computation in flight;
- after a change of the store, when the views are cheap to compute (all of them together under
  ``QUICK_CPU_S`` of CPU last time, one-time costs aside: a small fleet), the view is recomputed before the request is answered (up to
  ``FRESH_WAIT_S``), so that a client reads its own writes; a costlier one is answered from
  the cache while the worker recomputes it;
- the worker computes one view at a time on its loop's thread, views a request waits for
  first; the queue's forward simulations (one raw, calibrated by the outcomes of earlier estimates, and
  while those are too few the three of the run-time quantiles: the most likely start and its p10-p90
  interval; seconds of CPU at scale) run in a thread, or in a process of its own once they cost more than
  ``PROCESS_CPU_S``, while the others are computed; the queue view records its estimates and the starts of
  the jobs it estimated (``api.eta``: the live accuracy, and what calibrates the next views);
- the worker spends at most about a third of its time on one view: a computation that took
  ``t`` seconds is not started again within ``REST_FACTOR * t`` seconds of its end;
- a failed computation, or a worker that died, is answered 503 (``ViewUnavailable``) to the
  requests waiting for it; the next request starts a new worker.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib
import json
import logging
import multiprocessing
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from prometheus_client import CollectorRegistry, generate_latest

from api import insight
from api.estimates import EtaKeeper
from api.schemas import JobPublic, QueueEntry
from fairgang.settings import Settings
from scheduler.core import Snapshot
from scheduler.runtimes import LearnedRuntimes
from scheduler.snapshot import SnapshotReader
from simulator.calibrate import WaitCalibrator
from simulator.estimate import INTERVAL_QUANTILES
from store import jobs as stored_jobs
from store import observability
from store.db import Database
from store.models import Job

log = logging.getLogger("fairgang.api.views")

#: A view is recomputed when the store's version moves, and at least this often while it is asked for.
MAX_AGE_S = 5.0
#: When all views' last computations together cost less CPU than this (a small fleet), a request after a change
#: waits for its recomputation.
QUICK_CPU_S = 0.2
#: A first computation that cost less CPU than this is repeated at once to learn the view's steady cost.
CALIBRATE_CPU_S = 1.0
#: How long a request waits for a view's first computation (the worker's start included).
FIRST_WAIT_S = 120.0
#: How long a request waits for a cheap view's recomputation before it is answered the older one.
FRESH_WAIT_S = 5.0
#: A view whose computation took t seconds is not started again within REST_FACTOR * t seconds of its end.
REST_FACTOR = 2.0
#: A forward simulation of the queue that cost more CPU than this runs in a process of its own next time.
PROCESS_CPU_S = 0.5
#: How often the worker looks at the store's version while views are asked for.
POLL_S = 0.5
#: A view nobody asked for within this long is no longer refreshed.
IDLE_S = 60.0
#: The API process tells its worker that a view is still asked for at most this often (per view).
ASK_EVERY_S = 1.0
#: A view whose computation failed is not tried again within this long, unless a request waits for it.
FAILED_REST_S = 2.0
#: The worker's niceness: background work, it yields the CPU to the API and the other control-plane processes.
WORKER_NICE = 10
#: The module settings the API process passes on to its worker when it starts it.
TUNING = ("MAX_AGE_S", "QUICK_CPU_S", "CALIBRATE_CPU_S", "REST_FACTOR", "PROCESS_CPU_S", "POLL_S", "IDLE_S")
#: ("module:function", argument) pairs the worker calls before it starts (a test's instrumentation).
WORKER_SETUP: tuple[tuple[str, str], ...] = ()

Key = tuple[int, ...]


class ViewUnavailable(Exception):
    """The view has not been computed yet (its first computation failed or is still running)."""


@dataclass(frozen=True)
class View:
    """One computed view: its answer already encoded, and when, where and at what cost it was computed."""

    name: str
    key: Key
    #: What handlers read besides the bytes (the queue's positions and estimates); None for the other views.
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
    #: The process that computed it (the view worker).
    pid: int = 0
    #: A first computation, to be repeated at once to learn the view's steady cost (counted cheap meanwhile).
    calibrating: bool = False

    def covers(self, key: Key) -> bool:
        """Whether this view reflects the store at ``key`` (or later) and is not too old."""
        return _at_least(self.key, key) and time.time() - self.computed_at < MAX_AGE_S

    def headers(self) -> dict[str, str]:
        return {"X-Computed-At": repr(self.computed_at), "Cache-Control": "no-store"}


def _at_least(key: Key, other: Key) -> bool:
    return all(a >= b for a, b in zip(key, other, strict=True))


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def json_list(items: Sequence[bytes]) -> bytes:
    """A JSON array of already encoded items."""
    return b"[" + b",".join(items) + b"]"


# ---------------------------------------------------------------- the pipe between the API process and its worker


def _send(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("!Q", len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """The next message; EOFError when the other side has gone."""
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    (size,) = struct.unpack("!Q", head)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


# ---------------------------------------------------------------- the views (computed in the worker)


class Round:
    """One pass of the worker: the store read once at one version, shared by the views computed in it."""

    def __init__(self, worker: Refresher, db: Database, key: Key, now: float) -> None:
        self.worker, self.db, self.key, self.now = worker, db, key, now
        self._parts: dict[str, asyncio.Future[Any]] = {}
        #: CPU seconds a view's computation spent in other threads (the forward simulation's).
        self.thread_cpu_s: dict[str, float] = {}

    @property
    def settings(self) -> Settings:
        return self.worker.settings

    async def part(self, name: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """A part of the store read once in this round, whichever of the views computed concurrently asks first."""
        if name not in self._parts:
            self._parts[name] = asyncio.ensure_future(make())
        return await self._parts[name]

    async def snapshot(self) -> Snapshot:
        async def read() -> Snapshot:
            async with self.worker.reader_lock:  # one reader, kept across rounds: one read at a time
                return await insight.snapshot_now(self.db, self.settings, self.now, reader=self.worker.reader)

        snapshot: Snapshot = await self.part("snapshot", read)
        return snapshot

    async def queued(self) -> Sequence[Job]:
        queued: Sequence[Job] = await self.part("queued", lambda: stored_jobs.queued_jobs(self.db))
        return queued

    async def view(self, name: str) -> Computed:
        """A view at this round's version: the last one computed if it covers it, else computed (and published) now."""
        last = self.worker.views.get(name)
        if last is not None and last.view.covers(self.key):
            return last
        return await self.worker.compute(name, self)

    async def value(self, name: str) -> Any:
        return (await self.view(name)).value


#: What a view's computation returns: its full value (kept in the worker, for the views built on it),
#: the value sent to the API process, and how to encode it once its computation's end is known.
Result = tuple[Any, Any, Callable[[float], tuple[bytes, dict[str, list[bytes]]]]]


async def _fleet(r: Round) -> Result:
    fleet = await insight.fleet_view(r.db, r.settings, now=r.now)
    return fleet, None, lambda at: (_json({**fleet, "computed_at": at}), {})


async def _tenants(r: Round) -> Result:
    tenants = insight.tenant_usage_of(await r.snapshot(), r.settings, r.now)

    def encode(_at: float) -> tuple[bytes, dict[str, list[bytes]]]:
        rows = {t["name"]: [_json(t)] for t in tenants}
        return json_list([row for t in tenants for row in rows[t["name"]]]), rows

    return tenants, None, encode


@dataclass(frozen=True)
class QueueState:
    """The queue view's value: positions and estimates."""

    view: insight.QueueView


async def _queue(r: Round) -> Result:
    snapshot = await r.snapshot()  # with the run times the worker's reader learned (the placement service's predictor)
    ratios = r.worker.reader.runtimes.predictor.quantiles(INTERVAL_QUANTILES)
    keeper = r.worker.eta
    try:  # the earlier estimates' outcomes calibrate this view's
        calibrator = await keeper.refresh(r.db, r.now)
    except Exception:  # the store is busy: the calibrator as last read
        log.warning("views: cannot read the estimates' records", exc_info=True)
        calibrator = keeper.calibrator
    view, r.thread_cpu_s["queue"] = await r.worker.simulate(snapshot, ratios, r.now, calibrator)
    try:
        await keeper.record(r.db, snapshot.pending, view, r.now)
    except Exception:  # recorded at the next view
        log.warning("views: cannot record the estimates", exc_info=True)
    position = view.position
    jobs = sorted(await r.queued(), key=lambda j: (position.get(j.id, len(position) + 1), j.queued_at, j.id))
    entries = [
        (
            j.tenant,
            QueueEntry(
                position=pos,
                job=JobPublic.of(j),
                estimated_start=view.estimated_start.get(j.id),
                estimated_start_low=view.estimated_start_low.get(j.id),
                estimated_start_high=view.estimated_start_high.get(j.id),
            )
            .model_dump_json()
            .encode(),
        )
        for pos, j in enumerate(jobs, start=1)
    ]
    state = QueueState(view=view)

    def encode(_at: float) -> tuple[bytes, dict[str, list[bytes]]]:
        parts: dict[str, list[bytes]] = {}
        for tenant, row in entries:
            parts.setdefault(tenant, []).append(row)
        return json_list([row for _, row in entries]), parts

    return state, state, encode


def _simulate(snapshot: Snapshot, ratios: tuple[float, ...], now: float, calibrator: WaitCalibrator) -> tuple[insight.QueueView, float]:
    cpu = time.thread_time()
    view = insight.estimate_queue(snapshot, ratios, now, calibrator)
    return view, time.thread_time() - cpu


def _simulate_in_process(
    snapshot: Snapshot, ratios: tuple[float, ...], now: float, calibrator: WaitCalibrator
) -> tuple[insight.QueueView, float]:
    cpu = time.process_time()
    view = insight.estimate_queue(snapshot, ratios, now, calibrator)
    return view, time.process_time() - cpu


async def _metrics(r: Round) -> Result:
    from api import metrics  # here: api.metrics answers from this module

    fleet = await r.value("fleet")
    tenants = await r.value("tenants")
    families = await metrics.collect(r.db, r.settings, now=r.now, fleet=fleet, tenants=tenants, queued=await r.queued())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics.Families(families))
    body = generate_latest(registry)
    return families, None, lambda _at: (body, {})


COMPUTE: dict[str, Callable[[Round], Awaitable[Result]]] = {
    "fleet": _fleet,
    "tenants": _tenants,
    "metrics": _metrics,
    "queue": _queue,
}
#: The order the worker computes them in, one after the other on its loop's thread.
ORDER = ("fleet", "tenants", "metrics", "queue")
#: Views computed by a task of their own: the others are computed while the forward simulation runs.
BACKGROUND = frozenset({"queue"})


# ---------------------------------------------------------------- the API process's side


class ViewCache:
    """The views of one API process, sent by its view worker (started on first use, again if it dies)."""

    def __init__(self, settings: Settings, url: str) -> None:
        self.settings, self.url = settings, url
        self._lock = threading.Lock()
        self._views: dict[str, View] = {}
        #: name -> the store version a waiting request needs, as last told to the worker.
        self._wanted: dict[str, Key] = {}
        #: name -> when the worker was last told that the view is asked for (monotonic).
        self._told: dict[str, float] = {}
        #: name -> (when, why) of the last failed computation (cleared by a successful one).
        self._failed: dict[str, tuple[float, str]] = {}
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._closed = False
        #: The loop of the latest request: when it is closed (an app in a test went away) the worker is stopped.
        self._client: asyncio.AbstractEventLoop | None = None
        #: How many times each view was computed (for tests and the benchmark).
        self.computations: dict[str, int] = {}

    def cached(self, name: str) -> View | None:
        with self._lock:
            return self._views.get(name)

    @property
    def worker_pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    async def get(self, name: str, db: Database) -> View:
        """The view, as fresh as the rules above give it; raises ViewUnavailable when none could be had in time."""
        key = await observability.view_version(db)
        asked = time.monotonic()
        loop = asyncio.get_running_loop()
        self._client = loop
        view = self.cached(name)
        if view is not None and view.covers(key):
            self._ask(name, None)
            return view
        if view is None:
            wait = FIRST_WAIT_S
        elif self._worker_is_quick() or view.calibrating:
            wait = FRESH_WAIT_S
        else:
            self._ask(name, None)
            return view
        self._ask(name, key)
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

    def _worker_is_quick(self) -> bool:
        """Every view's last computation together cost under ``QUICK_CPU_S``: a small fleet, where a request can
        wait for a recomputation. (The worker computes one view at a time, so a view cheap on its own still waits
        behind the costly others on a large fleet: there every request is answered from the cache.)"""
        with self._lock:
            views = list(self._views.values())
        return sum(v.cpu_s for v in views) < QUICK_CPU_S

    def _ask(self, name: str, key: Key | None) -> None:
        """Tell the worker (started if need be) that the view is asked for, at least at ``key`` if given."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return
            wanted = self._wanted.get(name)
            if key is not None and (wanted is None or not _at_least(wanted, key)):
                key = key if wanted is None else tuple(max(a, b) for a, b in zip(wanted, key, strict=True))
                self._wanted[name] = key
            elif now - self._told.get(name, -ASK_EVERY_S) < ASK_EVERY_S and self._proc is not None:
                return
            else:
                key = None
            self._told[name] = now
            proc = self._proc if self._proc is not None else self._start()
            try:
                assert proc.stdin is not None
                _send(proc.stdin, ("ask", name, key))
            except (OSError, ValueError):  # it just died: its reader marks what waits as failed
                pass

    def _start(self) -> subprocess.Popen[bytes]:
        """Start the worker (with the lock held) and the thread that reads what it sends."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "from api.views import worker_main; worker_main()"
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert proc.stdin is not None
        module = sys.modules[__name__]
        tuning = {name: getattr(module, name) for name in TUNING}
        _send(proc.stdin, {"settings": self.settings, "url": self.url, "tuning": tuning, "setup": WORKER_SETUP})
        self._proc = proc
        # Whatever was wanted from a previous worker is asked of this one.
        for name, key in self._wanted.items():
            _send(proc.stdin, ("ask", name, key))
        threading.Thread(target=self._read, args=(proc,), name="fairgang-views", daemon=True).start()
        threading.Thread(target=self._watch, args=(proc,), name="fairgang-views-watch", daemon=True).start()
        return proc

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop the worker once the loop that asked last is closed (its app went away without a shutdown)."""
        while proc.poll() is None:
            time.sleep(1.0)
            client = self._client
            if client is not None and client.is_closed():
                with self._lock:
                    if self._proc is proc:
                        self._proc = None
                _stop(proc)
                return

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        try:
            while True:
                message = _receive(proc.stdout)
                now = time.monotonic()
                with self._lock:
                    if message[0] == "view":
                        view: View = message[1]
                        self._views[view.name] = view
                        self._failed.pop(view.name, None)
                        self.computations[view.name] = self.computations.get(view.name, 0) + 1
                        wanted = self._wanted.get(view.name)
                        if wanted is not None and _at_least(view.key, wanted):
                            del self._wanted[view.name]
                    elif message[0] == "failed":
                        _, name, why = message
                        self._failed[name] = (now, why)
                        self._wanted.pop(name, None)
                self._notify()
        except (EOFError, OSError, ValueError, pickle.UnpicklingError):
            pass
        code = proc.wait()
        with self._lock:
            if self._proc is proc:
                self._proc = None
            closed = self._closed
            if self._proc is None:  # (not yet replaced) what waited for it fails now
                now = time.monotonic()
                for name in list(self._wanted):
                    self._failed[name] = (now, f"the view worker stopped (exit status {code})")
                self._wanted.clear()
        if not closed:
            log.warning("view worker %d stopped (exit status %s)", proc.pid, code)
        self._notify()

    def _notify(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that request's loop is gone
                loop.call_soon_threadsafe(_settle, future)

    def close(self) -> None:
        """Stop the worker (it ends after its current computation; killed if it does not within 10 s)."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if proc is not None:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError, ValueError):
        assert proc.stdin is not None
        proc.stdin.close()  # its end of file: the worker stops
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# ---------------------------------------------------------------- the worker's side


@dataclass(frozen=True)
class Computed:
    """A view in the worker: what was sent, and the full value the views built on it use."""

    view: View
    value: Any


class Refresher:
    """The view worker's state: what is asked for, what was computed, what it keeps between computations."""

    def __init__(self, settings: Settings, url: str, out: IO[bytes]) -> None:
        self.settings, self.url, self.out = settings, url, out
        self._lock = threading.Lock()
        self._asked: dict[str, float] = {}
        self._wanted: dict[str, Key] = {}
        self._stop = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self.views: dict[str, Computed] = {}
        self._not_before: dict[str, float] = {}
        self.computations: dict[str, int] = {}
        #: Kept between computations: the scheduler's reader (it reads each job's fixed parts once).
        self.reader = SnapshotReader(runtimes=LearnedRuntimes(refresh_s=0.0))
        self.reader_lock = asyncio.Lock()
        #: The estimates' records and the calibrator made of their outcomes (``api.eta``).
        self.eta = EtaKeeper(retention_s=settings.eta_retention_s)
        #: Held by a computation while it runs on the loop's thread (one at a time, so that each one's CPU time
        #: is its own); the forward simulation lets go of it while it runs elsewhere.
        self.computing = asyncio.Lock()
        #: name -> the computation in flight, and the store version it computes.
        self._inflight: dict[str, tuple[asyncio.Task[Computed], Key]] = {}
        #: The last forward simulation's CPU seconds, and the process that runs costly ones.
        self._simulation_cpu_s = 0.0
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    async def simulate(
        self, snapshot: Snapshot, ratios: tuple[float, ...], now: float, calibrator: WaitCalibrator
    ) -> tuple[insight.QueueView, float]:
        """The forward simulations (median and interval), with their CPU seconds: in a thread while cheap, else in a process.

        Seconds of pure Python at scale: in a thread it would hold the worker's interpreter lock
        against the other views' computations (a cheap view a request waits for among them).
        """
        others = time.thread_time()
        self.computing.release()  # the other views are computed meanwhile
        try:
            if self._simulation_cpu_s < PROCESS_CPU_S:
                view, cpu = await asyncio.to_thread(_simulate, snapshot, ratios, now, calibrator)
            else:
                if self._pool is None:
                    context = multiprocessing.get_context("spawn")
                    self._pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context)
                loop = asyncio.get_running_loop()
                view, cpu = await loop.run_in_executor(self._pool, _simulate_in_process, snapshot, ratios, now, calibrator)
        finally:
            await self.computing.acquire()
        self._simulation_cpu_s = cpu
        # Its CPU seconds, less what the loop's thread spent on other views meanwhile.
        return view, cpu - (time.thread_time() - others)

    def listen(self, stream: IO[bytes]) -> None:
        """(Its own thread) What the API process asks, until it closes the pipe."""
        try:
            while True:
                message = _receive(stream)
                if message[0] == "ask":
                    _, name, key = message
                    with self._lock:
                        self._asked[name] = time.monotonic()
                        if key is not None:
                            wanted = self._wanted.get(name)
                            self._wanted[name] = key if wanted is None else tuple(max(a, b) for a, b in zip(wanted, key, strict=True))
                self._wake_up()
        except (EOFError, OSError, ValueError):
            pass
        with self._lock:
            self._stop = True
        self._wake_up()

    def _wake_up(self) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake.set)

    async def main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake.set()
        db = Database(self.url, **({} if self.url.startswith("sqlite") else {"pool_size": 4}))
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), POLL_S if self._asked_now() else None)
                self._wake.clear()
                with self._lock:
                    if self._stop:
                        return
                asked = self._asked_now()
                if not asked:
                    continue
                try:
                    key = await observability.view_version(db)
                except Exception as err:  # noqa: BLE001 - the store is unreachable for now
                    log.warning("views: cannot read the store's version: %s", err)
                    await asyncio.sleep(POLL_S)
                    continue
                pass_ = Round(self, db, key, time.time())
                with self._lock:
                    waited = [n for n in asked if n in self._wanted]
                # Views a request waits for first, on their own; the others when those are done.
                for name in waited or asked:
                    with self._lock:
                        wanted = self._wanted.get(name)
                    last = self.views.get(name)
                    resting = time.monotonic() < self._not_before.get(name, 0.0)
                    if last is not None and last.view.covers(key) and (wanted is None or last.view.covers(wanted)):
                        with self._lock:
                            if self._wanted.get(name) == wanted:
                                self._wanted.pop(name, None)
                        continue
                    if (resting and wanted is None) or name in self._inflight:
                        continue
                    if name in BACKGROUND:
                        task = asyncio.ensure_future(self._computing(name, pass_))
                        self._inflight[name] = (task, key)
                        task.add_done_callback(_retrieved)
                    else:
                        with contextlib.suppress(Exception):  # logged and sent in _computing
                            await self._computing(name, pass_)
        finally:
            for task, _ in list(self._inflight.values()):
                task.cancel()
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
            await db.dispose()

    async def _computing(self, name: str, pass_: Round) -> Computed:
        """One view's computation (and the views it is built on), holding the loop's thread (``computing``)."""
        try:
            async with self.computing:
                computed = await self.compute(name, pass_)
                if self.computations.get(name) == 1 and computed.view.cpu_s < CALIBRATE_CPU_S:
                    # A first computation includes one-time costs (connections, compiling the queries, reading
                    # every row the reader then keeps): repeat a cheap one at once, so that the cost the rules go
                    # by is its steady one.
                    computed = await self.compute(name, Round(self, pass_.db, pass_.key, time.time()))
                return computed
        except Exception as err:  # sent to the waiting requests; retried after a rest
            log.exception("views: computing %s failed", name)
            self._not_before[name] = time.monotonic() + FAILED_REST_S
            with self._lock:
                self._wanted.pop(name, None)
            _send(self.out, ("failed", name, str(err) or type(err).__name__))
            raise
        finally:
            self._inflight.pop(name, None)
            self._wake.set()  # the loop looks again: a change may have come meanwhile

    def _asked_now(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            return [n for n in ORDER if now - self._asked.get(n, -IDLE_S) < IDLE_S or n in self._wanted]

    async def compute(self, name: str, pass_: Round) -> Computed:
        """Compute one view and send it, stamped when its computation ended."""
        cpu, wall = time.thread_time(), time.perf_counter()
        value, shipped, encode = await COMPUTE[name](pass_)
        computed_at = time.time()
        body, parts = encode(computed_at)
        cpu_s = time.thread_time() - cpu + pass_.thread_cpu_s.get(name, 0.0)
        view = View(
            name=name,
            key=pass_.key,
            value=shipped,
            body=body,
            parts=parts,
            computed_at=computed_at,
            cpu_s=cpu_s,
            wall_s=time.perf_counter() - wall,
            pid=os.getpid(),
            calibrating=name not in self.computations and cpu_s < CALIBRATE_CPU_S,
        )
        _send(self.out, ("view", view))
        computed = Computed(view=view, value=value)
        self.views[name] = computed
        self.computations[name] = self.computations.get(name, 0) + 1
        self._not_before[name] = time.monotonic() + REST_FACTOR * view.wall_s
        with self._lock:
            wanted = self._wanted.get(name)
            if wanted is not None and _at_least(pass_.key, wanted):
                del self._wanted[name]
        return computed


def _retrieved(task: asyncio.Task[Computed]) -> None:
    if not task.cancelled():
        task.exception()  # logged and sent where it happened


def worker_main() -> None:
    """The view worker process: reads its settings from stdin, then what is asked; sends views on stdout."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, not into the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the API reaches the group: the API closes the pipe
    os.nice(WORKER_NICE)
    stream = sys.stdin.buffer
    config = _receive(stream)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module = sys.modules[__name__]
    for name, value in config["tuning"].items():
        setattr(module, name, value)
    for target, argument in config["setup"]:
        module_name, function = target.split(":")
        getattr(importlib.import_module(module_name), function)(argument)
    refresher = Refresher(config["settings"], config["url"], out)
    threading.Thread(target=refresher.listen, args=(stream,), name="fairgang-views-ask", daemon=True).start()
    asyncio.run(refresher.main())
