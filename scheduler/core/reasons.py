"""Why a queued job waits: a ranked code, and its text, built here and nowhere else.

Every job a cycle leaves waiting gets one :class:`Pending` code and the text
:func:`reason_text` makes of it and the facts of the case. The codes are listed in rank
order: when several apply to a job, the first listed is its reason. So a shape that can
never fit says so whatever else holds; "there is no room" comes before "over quota" (true
whatever the quota); and "reserved behind job X" is said only when nothing else stands in
the way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class Pending(StrEnum):
    """A pending reason's code, in rank order (the first that applies wins). Facts for the text in brackets."""

    #: No node of the job's GPU type in the fleet [gpu_type].
    NO_GPU_TYPE = "no_gpu_type"
    #: The job asks for no GPU at all [].
    NO_GPUS = "no_gpus"
    #: The gang's topology level is not one of the fleet's [level, levels].
    UNKNOWN_LEVEL = "unknown_level"
    #: A gang required on one node is larger than the largest node [count, gpu_type, largest].
    NODE_TOO_SMALL = "node_too_small"
    #: A gang required in one domain is larger than the largest domain of that level [level, largest, gpu_type, count].
    DOMAIN_TOO_SMALL = "domain_too_small"
    #: A gang is larger than all full-size nodes of its type together [largest, gpu_type, count].
    FLEET_TOO_SMALL = "fleet_too_small"
    #: Backfill is off and an earlier job of the type holds its reservation [holder].
    BACKFILL_OFF = "backfill_off"
    #: Nominated: its GPUs come free once these running jobs have stopped [victims].
    PREEMPTING = "preempting"
    #: Nominated: its GPUs come free once these elastic jobs have shrunk to give back GPUs above their minimum [donors].
    SHRINKING = "shrinking"
    #: No node of its GPU type is schedulable now [gpu_type].
    NO_SCHEDULABLE_NODE = "no_schedulable_node"
    #: No node has enough free GPUs for a single-node job [gpu_type, count; holds, start_at, now when it holds the
    #: reservation].
    NO_FREE_NODE = "no_free_node"
    #: No topology domain has enough wholly free nodes for a gang [gpu_type, count, level (None: any);
    #: holds, start_at, now when it holds the reservation].
    NO_FREE_DOMAIN = "no_free_domain"
    #: Its tenant's quota does not admit it [tenant, used, count, gpu_type, nominal, cohort, borrow_limit]: the text
    #: names what holds it: its guarantee (no cohort to borrow from), its borrowing limit, or its cohort's idle quota.
    OVER_QUOTA = "over_quota"
    #: It would fit but for another job's reservation [holder].
    RESERVED = "reserved"

    @property
    def rank(self) -> int:
        """Its place in the order above: of two codes that both apply, the lower rank is the job's reason."""
        return _RANKS[self]


_RANKS = {code: rank for rank, code in enumerate(Pending)}


@dataclass(frozen=True, slots=True)
class PendingReason:
    """A pending reason: its code and the text shown for it."""

    code: Pending
    text: str


def pending_reason(code: Pending, **facts: Any) -> PendingReason:
    """The reason ``code`` with the text :func:`reason_text` makes of ``facts``."""
    return PendingReason(code, reason_text(code, **facts))


def reason_text(code: Pending, **facts: Any) -> str:
    """The text shown for a pending reason, from its code and the facts :class:`Pending` lists for it."""
    f = facts
    match code:
        case Pending.NO_GPU_TYPE:
            return f"node shape can never fit: no {f['gpu_type']} node in the fleet"
        case Pending.NO_GPUS:
            return "node shape can never fit: a job needs at least one GPU"
        case Pending.UNKNOWN_LEVEL:
            return f"node shape can never fit: unknown topology level {f['level']!r} (levels: node, {', '.join(f['levels'])})"
        case Pending.NODE_TOO_SMALL:
            return f"node shape can never fit: {f['count']} GPUs on one node, the largest {f['gpu_type']} node has {f['largest']}"
        case Pending.DOMAIN_TOO_SMALL:
            return f"node shape can never fit: the largest {f['level']} has {f['largest']} {f['gpu_type']} GPUs, the job needs {f['count']}"
        case Pending.FLEET_TOO_SMALL:
            return f"node shape can never fit: the fleet has {f['largest']} {f['gpu_type']} GPUs in big nodes, it needs {f['count']}"
        case Pending.BACKFILL_OFF:
            return f"reserved behind job {f['holder']} (backfill is off)"
        case Pending.PREEMPTING:
            return "waiting for preemption of " + ", ".join(f["victims"])
        case Pending.SHRINKING:
            return "waiting for elastic jobs to give back GPUs above their minimum: " + ", ".join(f["donors"])
        case Pending.NO_SCHEDULABLE_NODE:
            return f"no schedulable {f['gpu_type']} node"
        case Pending.NO_FREE_NODE:
            return f"no {f['gpu_type']} node has {f['count']} free GPUs" + _holding(f)
        case Pending.NO_FREE_DOMAIN:
            where = f" in one {f['level']}" if f.get("level") else ""
            return f"no topology domain fits: not enough wholly free {f['gpu_type']} nodes{where} for {f['count']} GPUs" + _holding(f)
        case Pending.OVER_QUOTA:
            head = f"over quota: tenant {f['tenant']} uses {f['used']} {f['gpu_type']} GPUs and asks for {f['count']} more"
            if f["cohort"] is None:
                return f"{head}; its guarantee is {f['nominal']} and it has no cohort to borrow from"
            limit = f["borrow_limit"]
            if limit is not None and f["used"] + f["count"] > f["nominal"] + limit:
                return f"{head}; its guarantee of {f['nominal']} plus its borrowing limit of {limit} allow {f['nominal'] + limit}"
            return f"{head}; beyond its guarantee of {f['nominal']}, cohort {f['cohort']} has no idle {f['gpu_type']} quota to lend"
        case Pending.RESERVED:
            return f"reserved behind job {f['holder']}"


def _holding(facts: dict[str, Any]) -> str:
    """The reservation a blocked job holds, when it holds one."""
    node_ids = facts.get("holds")
    if not node_ids:
        return ""
    listed = ", ".join(node_ids) if len(node_ids) <= 4 else f"{', '.join(node_ids[:4])} and {len(node_ids) - 4} more"
    return f"; holds a reservation on {listed} from {clock_time(facts['start_at'], facts.get('now', 0.0))}"


def clock_time(at: float, now: float) -> str:
    """``at`` as a UTC clock time and how far from ``now``: "14:30 UTC, in 20 min" (the date too when it is
    another day: "2026-12-03 02:00 UTC, in 14 h 5 min")."""
    moment, today = datetime.fromtimestamp(at, UTC), datetime.fromtimestamp(now, UTC)
    stamp = moment.strftime("%H:%M UTC") if moment.date() == today.date() else moment.strftime("%Y-%m-%d %H:%M UTC")
    return f"{stamp}, {_from_now(at - now)}"


def _from_now(seconds: float) -> str:
    if seconds < 60:
        return "now" if seconds <= 0 else "in under a minute"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"in {minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"in {hours} h" + (f" {minutes} min" if minutes else "")
