"""GET /metrics: fleet, queue, tenant, job and health metrics for Prometheus, computed from the store.

Every value is read from the store (counters are counts of rows in its append-only event log,
counted in SQL), so any number of API replicas answer the same and a restart loses no counter.
Each API process's view worker (``api.views``, a child process) computes them, and the API
answers scrapes from that cache, at most a few seconds old. See docs/metrics.md for every metric.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from api import insight
from api.deps import State
from fairgang.settings import Settings
from simulator.workload import size_class
from store import eta, health, jobs, observability
from store.db import Database
from store.models import Job

router = APIRouter(tags=["metrics"])

WAIT_BUCKETS = (10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0, 24 * 3600.0)
#: Buckets of the predicted starts' absolute errors (seconds).
NODE_STATES = ("DOWN", "READY", "CORDONED", "LOST", "RETIRED")
PREEMPT_REASONS = ("priority", "reclaim", "max_wait", "health")


def preemption_reason(message: str) -> str:
    """The policy behind a preemption's message: priority, reclaim, max_wait, health, or manual (by hand)."""
    head = message.split(":", 1)[0].strip()
    return head if head in PREEMPT_REASONS else "manual"


def requeue_reason(message: str) -> str:
    """Why an attempt went back to the queue: a preemption's reason, ``retry`` (its own failure) or ``infrastructure``."""
    if message.startswith("preempted: "):
        return preemption_reason(message[len("preempted: ") :])
    if message.startswith("job failed"):
        return "retry"
    return "infrastructure"


class Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _histogram(
    name: str, doc: str, labels: list[str], groups: dict[tuple[str, ...], list[observability.StartedWaits]]
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, rows in sorted(groups.items()):
        buckets: list[tuple[str, float]] = [(str(b), float(sum(r.at_most[i] for r in rows))) for i, b in enumerate(WAIT_BUCKETS)]
        buckets.append(("+Inf", float(sum(r.count for r in rows))))
        family.add_metric(list(key), buckets, sum_value=sum(r.sum_s for r in rows))
    return family


async def collect(
    db: Database,
    settings: Settings,
    *,
    now: float | None = None,
    fleet: dict[str, Any] | None = None,
    tenants: list[dict[str, Any]] | None = None,
    queued: Sequence[Job] | None = None,
) -> list[Metric]:
    """Every store-derived metric family, as of now (from the fleet, tenant and queued-job views given, else read here)."""
    now = time.time() if now is None else now
    fleet = fleet if fleet is not None else await insight.fleet_view(db, settings, now=now)
    tenants = tenants if tenants is not None else await insight.tenant_usage(db, settings, now=now)
    queued = queued if queued is not None else await jobs.queued_jobs(db)
    out: list[Metric] = []

    # Fleet: every GPU in exactly one state; capacity and healthy per type; measured utilisation.
    gpus = GaugeMetricFamily(
        "fairgang_gpus", "GPUs by type and state (allocated, free, unhealthy, unavailable).", labels=["gpu_type", "state"]
    )
    capacity = GaugeMetricFamily("fairgang_gpus_capacity", "GPUs in the fleet, by type.", labels=["gpu_type"])
    healthy = GaugeMetricFamily("fairgang_gpus_healthy", "Healthy GPUs, by type.", labels=["gpu_type"])
    per_type: dict[str, dict[str, int]] = {}
    util = GaugeMetricFamily(
        "fairgang_gpu_utilization_ratio", "Measured GPU utilisation (0-1) from the agents.", labels=["node", "gpu", "gpu_type"]
    )
    for node in fleet["nodes"]:
        counts = per_type.setdefault(node["gpu_type"], {"allocated": 0, "free": 0, "unhealthy": 0, "unavailable": 0, "total": 0})
        used, free, bad = node["gpus"]["used"], node["gpus"]["free"], node["gpus"]["unhealthy"]
        counts["total"] += node["gpu_count"]
        counts["unhealthy"] += bad
        counts["allocated"] += used
        counts["free"] += free
        counts["unavailable"] += max(0, node["gpu_count"] - used - free - bad)
        for gpu in node["gpu_health"]:
            pct = gpu.get("utilization_pct")
            if isinstance(pct, int | float):
                util.add_metric([node["id"], str(gpu["index"]), node["gpu_type"]], float(pct) / 100.0)
    for gpu_type, counts in sorted(per_type.items()):
        for state in ("allocated", "free", "unhealthy", "unavailable"):
            gpus.add_metric([gpu_type, state], counts[state])
        capacity.add_metric([gpu_type], counts["total"])
        healthy.add_metric([gpu_type], counts["total"] - counts["unhealthy"])
    frag = GaugeMetricFamily(
        "fairgang_gpus_stranded", "Free GPUs on partly used nodes (no whole-node gang can use them).", labels=["gpu_type"]
    )
    for gpu_type, totals in sorted(fleet["gpu_types"].items()):
        frag.add_metric([gpu_type], totals["stranded"])
    nodes = GaugeMetricFamily("fairgang_nodes", "Nodes by state.", labels=["state"])
    node_states = [n["state"] for n in fleet["nodes"]] + ["RETIRED"] * len(fleet["retired"])
    for state in sorted(set(NODE_STATES) | set(node_states)):
        nodes.add_metric([state], node_states.count(state))
    out += [gpus, capacity, healthy, util, frag, nodes]

    # Queue: length and the oldest wait now, waits of the attempts that started.
    length = GaugeMetricFamily("fairgang_queue_length", "Waiting jobs.", labels=["tenant", "gpu_type", "size_class"])
    oldest = GaugeMetricFamily(
        "fairgang_queue_oldest_wait_seconds", "How long the longest-waiting job has waited.", labels=["tenant", "gpu_type", "size_class"]
    )
    groups: dict[tuple[str, ...], list[float]] = {}
    for job in queued:
        groups.setdefault((job.tenant, job.gpu_type, size_class(job.gpu_count)), []).append(max(0.0, now - job.queued_at))
    for key, waits in sorted(groups.items()):
        length.add_metric(list(key), len(waits))
        oldest.add_metric(list(key), max(waits))
    started_waits: dict[tuple[str, ...], list[observability.StartedWaits]] = {}
    for started in await observability.started_attempt_waits(db, WAIT_BUCKETS):
        started_waits.setdefault((started.tenant, started.gpu_type, size_class(started.gpu_count)), []).append(started)
    out += [
        length,
        oldest,
        _histogram(
            "fairgang_queue_wait_seconds",
            "Queue wait of each job's current attempt, once it started.",
            ["tenant", "gpu_type", "size_class"],
            started_waits,
        ),
    ]

    # Tenants.
    guaranteed = GaugeMetricFamily("fairgang_tenant_guaranteed_gpus", "Guaranteed (nominal) GPUs.", labels=["tenant", "gpu_type"])
    used_g = GaugeMetricFamily("fairgang_tenant_used_gpus", "GPUs held by the tenant's jobs.", labels=["tenant", "gpu_type"])
    borrowed = GaugeMetricFamily("fairgang_tenant_borrowed_gpus", "GPUs used beyond the guarantee.", labels=["tenant", "gpu_type"])
    share = GaugeMetricFamily("fairgang_tenant_dominant_share", "Weighted dominant share (with decayed past usage).", labels=["tenant"])
    for tenant in tenants:
        for gpu_type, q in sorted(tenant["quotas"].items()):
            guaranteed.add_metric([tenant["name"], gpu_type], q["guaranteed"])
            used_g.add_metric([tenant["name"], gpu_type], q["used"])
            borrowed.add_metric([tenant["name"], gpu_type], q["borrowed"])
        share.add_metric([tenant["name"]], tenant["dominant_share"])
    out += [guaranteed, used_g, borrowed, share]

    # Preemptions and requeues (counts of the event log), and health events.
    preemptions = CounterMetricFamily("fairgang_preemptions", "Preemptions by reason.", labels=["reason"])
    requeues = CounterMetricFamily("fairgang_requeues", "Attempts sent back to the queue, by reason.", labels=["reason"])
    resizes = CounterMetricFamily(
        "fairgang_resizes", "Elastic jobs' resizes committed, by direction and reason.", labels=["direction", "reason"]
    )
    counted: dict[str, dict[str, int]] = {"PREEMPTING": {}, "REQUEUED": {}}
    for kind, head, n in await observability.event_message_heads(db, ["PREEMPTING", "REQUEUED", "RESIZED"]):
        if kind == "RESIZED":
            direction, _, why = head.partition(" (")
            resizes.add_metric([direction, why.rstrip(")")], n)
            continue
        reason = preemption_reason(head) if kind == "PREEMPTING" else requeue_reason(head)
        counted[kind][reason] = counted[kind].get(reason, 0) + n
    for reason in sorted(set(PREEMPT_REASONS) | {"manual"} | set(counted["PREEMPTING"])):
        preemptions.add_metric([reason], counted["PREEMPTING"].get(reason, 0))
    for reason in sorted(set(PREEMPT_REASONS) | {"manual", "retry", "infrastructure"} | set(counted["REQUEUED"])):
        requeues.add_metric([reason], counted["REQUEUED"].get(reason, 0))
    out += [preemptions, requeues, resizes]
    out += list(await _health_events(db))
    out += _eta_errors(await eta.error_counts(db))
    return out


def _eta_errors(groups: Sequence[eta.ErrorCounts]) -> list[Metric]:
    """The recorded estimates of the queue's starts, scored once their jobs started (``store.eta``)."""
    labels = ["gpu_type", "size_class", "kind"]
    errors = HistogramMetricFamily(
        "fairgang_eta_abs_error_seconds",
        "Absolute error of recorded start estimates (most likely start - actual first start), once the job started.",
        labels=labels,
    )
    covered = CounterMetricFamily(
        "fairgang_eta_within_interval", "Recorded start estimates whose job started within their p10-p90 interval.", labels=labels
    )
    late = CounterMetricFamily(
        "fairgang_eta_started_late", "Recorded start estimates whose job started later than the most likely start.", labels=labels
    )
    for g in sorted(groups, key=lambda g: (g.gpu_type, g.size_class, g.kind)):
        key = [g.gpu_type, g.size_class, g.kind]
        buckets = [(str(b), float(n)) for b, n in zip(eta.ERROR_BOUNDS_S, g.at_most, strict=True)]
        buckets.append(("+Inf", float(g.count)))
        errors.add_metric(key, buckets, sum_value=g.sum_abs_s)
        covered.add_metric(key, g.covered)
        late.add_metric(key, g.late)
    return [errors, covered, late]


async def _health_events(db: Database) -> Iterable[Metric]:
    family = CounterMetricFamily("fairgang_health_events", "GPU health events recorded, by kind.", labels=["kind"])
    for kind, n in sorted((await health.health_event_counts(db)).items()):
        family.add_metric([kind], n)
    return [family]


@router.get("/metrics", include_in_schema=False)
async def metrics(state: State) -> Any:
    """Prometheus text format; unauthenticated, like any scrape target on the operators' network.

    Answered from the process's view cache (``api.views``): any number of scrapers cost one collection.
    """
    view = await state.views.get("metrics", state.db)
    return Response(view.body, media_type=CONTENT_TYPE_LATEST, headers=view.headers())
