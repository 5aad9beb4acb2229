"""Prometheus metrics of the long-running processes (names prefixed ``fairgang_``; see docs/metrics.md).

The placement service records its cycles here and serves them on its own port
(``FAIRGANG_SCHEDULER_METRICS_PORT``); the fleet, queue and tenant gauges are computed
from the store by the API at scrape time (``api/metrics.py``). Temporal's own SDK metrics
come from a ``temporalio`` Runtime with a Prometheus endpoint, created once per process
when ``FAIRGANG_TEMPORAL_METRICS_BIND`` is set.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

log = logging.getLogger("fairgang.metrics")

#: Seconds: a cycle is milliseconds at small scale, a second or two at full scale (SPEC R8.2).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

SCHEDULING_CYCLE = Histogram(
    "fairgang_scheduling_cycle_seconds", "One whole placement cycle: lease, snapshot, decide, commit, signal.", buckets=LATENCY_BUCKETS
)
SCHEDULING_DECISION = Histogram(
    "fairgang_scheduling_decision_seconds", "The pure decision of one cycle (run_cycle on the snapshot).", buckets=LATENCY_BUCKETS
)
SCHEDULING_PHASE = Histogram(
    "fairgang_scheduling_phase_seconds",
    "One phase of a placement cycle: snapshot (the store read), core (the decision), commit (the fenced transaction).",
    ["phase"],
    buckets=LATENCY_BUCKETS,
)
BINDINGS = Counter("fairgang_scheduler_bindings", "Gangs bound to GPUs and committed by the placement service.")
PREEMPTIONS_ASKED = Counter("fairgang_scheduler_preemptions_asked", "Preemptions the placement service asked for, by reason.", ["reason"])
RESIZES_ASKED = Counter(
    "fairgang_scheduler_resizes_asked",
    "Resizes of elastic jobs the placement service asked for, by direction and reason.",
    ["direction", "reason"],
)
PENDING = Gauge("fairgang_scheduler_pending_jobs", "Jobs left waiting by the latest cycle.")
LEADER = Gauge("fairgang_scheduler_leader", "1 while this placement service holds the leader lease.")

_runtime: Runtime | None = None


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Serve this process's default registry on ``host:port`` (a background thread)."""
    start_http_server(port, addr=host)
    log.info("metrics on http://%s:%d/metrics", host, port)


def temporal_runtime(bind: str | None) -> Runtime | None:
    """The process's Temporal runtime exporting SDK metrics on ``bind`` (host:port); None: the SDK's default runtime.

    Created once per process: a second Runtime would try to bind the same address again.
    """
    global _runtime
    if not bind:
        return None
    if _runtime is None:
        _runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind)))
        log.info("temporal SDK metrics on http://%s/metrics", bind)
    return _runtime
