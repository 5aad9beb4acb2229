"""What-if on the live queue (pure): apply a proposed change to a snapshot, replay both futures, compare them.

A :class:`Proposal` names changes to a tenant (its weight, a quota), to the fleet (nodes added, nodes
drained) and to the policy (a ``SchedulerConfig`` setting). :func:`apply` makes the changed snapshot,
refusing a change that names an unknown tenant, node, GPU type, topology level or setting with a
:class:`ProposalError` that names the bad field. :func:`what_if` replays the next hours twice with
``simulator.estimate.estimate_starts`` and the production core (a fresh ``Scheduler`` for each
future), once as things are and once with the change, and :func:`compare` turns the two sets of
predicted starts into per-tenant and per-job shifts.

The replay is the queue-wait estimator's: no new arrivals, running jobs end at their expected end,
a started job runs for its expected run time (else its max runtime). Pure: no clock, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduler.core import Scheduler, SchedulerConfig
from scheduler.core.types import NodeView, Quota, Snapshot, TenantView
from simulator.calibrate import WaitCalibrator, calibrate_starts
from simulator.estimate import Policy, estimate_starts, scaled

#: A running job already past its expected end is taken to end this long from now (as the queue view does).
OVERDUE_S = 60.0

#: What the name of a node added by a what-if starts with.
ADDED_PREFIX = "whatif-"


class ProposalError(ValueError):
    """A proposed change that cannot be applied: ``field`` names what is wrong, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason

    def __reduce__(self) -> tuple[type[ProposalError], tuple[str, str]]:
        return (ProposalError, (self.field, self.reason))  # raised in another process, it arrives whole


@dataclass(frozen=True)
class QuotaChange:
    """A tenant's quota of one GPU type: the new one, or None to take the type away."""

    tenant: str
    gpu_type: str
    quota: Quota | None


@dataclass(frozen=True)
class AddNodes:
    """``count`` nodes of ``gpus`` GPUs of ``gpu_type``, in a topology domain: ``domain`` names it at some
    levels (e.g. ``{"leaf": "l1"}``: the leaf l1, with the wider levels of l1's nodes); at every other level
    the group gets a new domain of its own."""

    count: int
    gpu_type: str
    gpus: int
    domain: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Proposal:
    """The changes of one what-if (any may be combined; none: the future as it is)."""

    #: Tenant -> new weight.
    weights: tuple[tuple[str, float], ...] = ()
    quotas: tuple[QuotaChange, ...] = ()
    add_nodes: tuple[AddNodes, ...] = ()
    #: Nodes that get no new work (their running jobs run to their end).
    drain: tuple[str, ...] = ()
    #: ``SchedulerConfig`` field -> new value (already of the field's type: see :func:`policy_value`).
    policy: tuple[tuple[str, float | int | bool], ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.weights or self.quotas or self.add_nodes or self.drain or self.policy)


def _policy_types() -> dict[str, type]:
    hints = typing.get_type_hints(SchedulerConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(SchedulerConfig)}


#: The policy settings a what-if may change, with their types.
POLICY_TYPES: dict[str, type] = _policy_types()


def policy_value(name: str, value: object, *, field: str | None = None) -> float | int | bool:
    """``value`` (as given: text, or a JSON value) checked against the type of ``SchedulerConfig.<name>``."""
    where = field or f"policy.{name}"
    kind = POLICY_TYPES.get(name)
    if kind is None:
        raise ProposalError(where, f"no policy setting {name!r}; one of {', '.join(sorted(POLICY_TYPES))}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
        raise ProposalError(where, f"{value!r} is not a boolean (true or false)")
    if isinstance(value, bool):
        raise ProposalError(where, f"{value!r} is not a number")
    if kind is int:
        try:
            number: float | int = int(str(value).strip()) if not isinstance(value, int) else value
        except ValueError:
            raise ProposalError(where, f"{value!r} is not a whole number") from None
    else:
        try:
            number = float(value) if isinstance(value, int | float) else float(str(value).strip())
        except (ValueError, OverflowError):
            raise ProposalError(where, f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise ProposalError(where, f"{value!r} is not a finite number")
    if number < 0:
        raise ProposalError(where, f"{value!r} is negative")
    return number


def _quota_problem(quota: Quota) -> str | None:
    for name in ("nominal", "borrow_limit", "lend_limit"):
        value = getattr(quota, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            return f"{name} must be a whole number, at least 0 (got {value!r})"
    return None


def _labels_for(group: AddNodes, index: int, snapshot: Snapshot, field: str) -> tuple[tuple[str, str], ...]:
    levels = [level for level in snapshot.topology_levels if level != "node"]
    named = dict(group.domain)
    for level in named:
        if level not in levels:
            raise ProposalError(f"{field}.domain", f"no topology level {level!r}; one of {', '.join(levels) or '(none)'}")
        if not named[level]:
            raise ProposalError(f"{field}.domain", f"the {level} domain needs a name")
    labels: dict[str, str] = {}
    # The widest named level decides the levels above it: those of a node already in that domain.
    for position, level in enumerate(levels):
        if level in named:
            labels[level] = named[level]
            peer = next((n for n in snapshot.nodes if n.domain(level) == named[level]), None)
            for wider in levels[position + 1 :]:
                value = peer.domain(wider) if peer is not None else None
                if wider not in named and value is not None:
                    labels.setdefault(wider, value)
    for level in levels:
        labels.setdefault(level, f"{ADDED_PREFIX}{index}-{level}")
    return tuple(sorted(labels.items()))


def apply(snapshot: Snapshot, proposal: Proposal, *, now: float, decayed: Mapping[str, Mapping[str, float]] | None = None) -> Snapshot:
    """The snapshot as it would be with the proposal's changes; :class:`ProposalError` for a change that names
    something unknown or a value out of range. ``decayed`` replaces every tenant's decayed usage (for a changed
    half-life: the caller integrates it again)."""
    tenants = {t.name: t for t in snapshot.tenants}
    if proposal.empty and decayed is None:
        return snapshot
    for name, weight in proposal.weights:
        field = f"weights.{name}"
        if name not in tenants:
            raise ProposalError(field, f"no tenant {name!r}; one of {', '.join(sorted(tenants)) or '(none)'}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) or weight <= 0:
            raise ProposalError(field, f"the weight must be a number above 0 (got {weight!r})")
        tenants[name] = dataclasses.replace(tenants[name], weight=float(weight))
    nodes = list(snapshot.nodes)
    ids = {n.id for n in nodes}
    for name in proposal.drain:
        if name not in ids:
            raise ProposalError("drain", f"no node {name!r} in the fleet")
    drained = set(proposal.drain)
    nodes = [dataclasses.replace(n, schedulable=False) if n.id in drained else n for n in nodes]
    for g, group in enumerate(proposal.add_nodes):
        field = f"add_nodes[{g}]"
        if isinstance(group.count, bool) or not isinstance(group.count, int) or group.count < 1:
            raise ProposalError(f"{field}.count", f"at least 1 node (got {group.count!r})")
        if isinstance(group.gpus, bool) or not isinstance(group.gpus, int) or group.gpus < 1:
            raise ProposalError(f"{field}.gpus", f"at least 1 GPU a node (got {group.gpus!r})")
        if not group.gpu_type:
            raise ProposalError(f"{field}.gpu_type", "a GPU type is needed")
        labels = _labels_for(group, g + 1, snapshot, field)
        for k in range(group.count):
            node_id = f"{ADDED_PREFIX}{g + 1}-{k + 1}"
            while node_id in ids:
                node_id += "x"
            ids.add(node_id)
            nodes.append(
                NodeView(
                    id=node_id,
                    gpu_type=group.gpu_type,
                    gpu_count=group.gpus,
                    labels=labels,
                    free=frozenset(range(group.gpus)),
                    schedulable=True,
                    free_since=now,
                )
            )
    gpu_types = {n.gpu_type for n in nodes}
    for change in proposal.quotas:
        field = f"quotas.{change.tenant}.{change.gpu_type}"
        if change.tenant not in tenants:
            raise ProposalError(field, f"no tenant {change.tenant!r}; one of {', '.join(sorted(tenants)) or '(none)'}")
        if change.gpu_type not in gpu_types:
            raise ProposalError(field, f"no GPU type {change.gpu_type!r} in the fleet; one of {', '.join(sorted(gpu_types))}")
        quotas = dict(tenants[change.tenant].quotas)
        if change.quota is None:
            quotas.pop(change.gpu_type, None)
        else:
            problem = _quota_problem(change.quota)
            if problem:
                raise ProposalError(field, problem)
            quotas[change.gpu_type] = change.quota
        tenants[change.tenant] = dataclasses.replace(tenants[change.tenant], quotas=tuple(sorted(quotas.items())))
    config = snapshot.config
    if proposal.policy:
        values = {name: policy_value(name, value) for name, value in proposal.policy}
        config = dataclasses.replace(config, **values)  # type: ignore[arg-type]
    views: list[TenantView] = list(tenants.values())
    if decayed is not None:
        views = [
            dataclasses.replace(t, decayed_usage=tuple(sorted((k, v) for k, v in decayed.get(t.name, {}).items() if v > 0.0)))
            for t in views
        ]
    return dataclasses.replace(snapshot, nodes=tuple(nodes), tenants=tuple(views), config=config)


def _quota_text(quota: Quota | None) -> str:
    if quota is None:
        return "none"
    text = str(quota.nominal)
    if quota.borrow_limit is not None:
        text += f" (borrow at most {quota.borrow_limit})"
    if quota.lend_limit is not None:
        text += f" (lend at most {quota.lend_limit})"
    return text


def describe(snapshot: Snapshot, proposal: Proposal) -> list[str]:
    """The proposal's changes in words, each with what it replaces (for a proposal :func:`apply` accepted)."""
    tenants = {t.name: t for t in snapshot.tenants}
    out = []
    for name, weight in proposal.weights:
        old = tenants[name].weight if name in tenants else None
        out.append(f"tenant {name}: weight {old:g} -> {weight:g}" if old is not None else f"tenant {name}: weight {weight:g}")
    for change in proposal.quotas:
        old_quota = dict(tenants[change.tenant].quotas).get(change.gpu_type) if change.tenant in tenants else None
        out.append(f"tenant {change.tenant}: {change.gpu_type} quota {_quota_text(old_quota)} -> {_quota_text(change.quota)}")
    for group in proposal.add_nodes:
        where = ", ".join(f"{level} {domain}" for level, domain in group.domain) or "a new topology domain"
        out.append(f"add {group.count} node(s) of {group.gpus} {group.gpu_type} GPUs in {where}")
    out.extend(f"drain node {name} (no new work; its jobs run to their end)" for name in proposal.drain)
    for name, value in proposal.policy:
        out.append(f"policy {name}: {getattr(snapshot.config, name)} -> {value}")
    return out or ["no change"]


# ---------------------------------------------------------------- comparing the two futures


@dataclass(frozen=True)
class JobShift:
    """One waiting job's predicted start without and with the change (None: not within the horizon)."""

    job_id: str
    tenant: str
    gpu_type: str
    gpu_count: int
    before: float | None
    after: float | None

    @property
    def shift_s(self) -> float | None:
        """How much later (positive) or earlier (negative) it starts with the change; None unless both start."""
        return None if self.before is None or self.after is None else self.after - self.before


@dataclass(frozen=True)
class TenantShift:
    """A tenant's waiting jobs without and with the change.

    Waits run from now to the predicted start; a job that does not start within the horizon counts as waiting
    the whole horizon (so a mean or median that includes one is a lower bound).
    """

    tenant: str
    waiting: int
    mean_wait_before_s: float
    mean_wait_after_s: float
    median_wait_before_s: float
    median_wait_after_s: float
    started_before: int
    started_after: int


@dataclass(frozen=True)
class WhatIf:
    now: float
    horizon_s: float
    #: Per tenant with waiting jobs (by name), then all of them together (tenant ``*``).
    tenants: tuple[TenantShift, ...]
    #: Every waiting job, by predicted start without the change (then id).
    jobs: tuple[JobShift, ...]


#: The tenant name of the row that sums every tenant.
ALL = "*"


def _waits(starts: Sequence[float | None], now: float, horizon_s: float) -> list[float]:
    return [min(max(s - now, 0.0), horizon_s) if s is not None else horizon_s for s in starts]


def _row(tenant: str, jobs: Sequence[JobShift], now: float, horizon_s: float) -> TenantShift:
    before = _waits([j.before for j in jobs], now, horizon_s)
    after = _waits([j.after for j in jobs], now, horizon_s)
    return TenantShift(
        tenant=tenant,
        waiting=len(jobs),
        mean_wait_before_s=statistics.fmean(before) if before else 0.0,
        mean_wait_after_s=statistics.fmean(after) if after else 0.0,
        median_wait_before_s=float(statistics.median(before)) if before else 0.0,
        median_wait_after_s=float(statistics.median(after)) if after else 0.0,
        started_before=sum(1 for j in jobs if j.before is not None),
        started_after=sum(1 for j in jobs if j.after is not None),
    )


def compare(snapshot: Snapshot, before: Mapping[str, float], after: Mapping[str, float], *, now: float, horizon_s: float) -> WhatIf:
    """The shifts between two sets of predicted starts of ``snapshot``'s waiting jobs (starts before ``now`` count as now)."""

    def at(starts: Mapping[str, float], job_id: str) -> float | None:
        start = starts.get(job_id)
        return None if start is None else max(start, now)

    never = math.inf
    jobs = sorted(
        (
            JobShift(
                job_id=j.id, tenant=j.tenant, gpu_type=j.gpu_type, gpu_count=j.gpu_count, before=at(before, j.id), after=at(after, j.id)
            )
            for j in snapshot.pending
        ),
        key=lambda s: (s.before if s.before is not None else never, s.job_id),
    )
    by_tenant: dict[str, list[JobShift]] = {}
    for shift in jobs:
        by_tenant.setdefault(shift.tenant, []).append(shift)
    rows = [_row(name, by_tenant[name], now, horizon_s) for name in sorted(by_tenant)]
    rows.append(_row(ALL, jobs, now, horizon_s))
    return WhatIf(now=now, horizon_s=horizon_s, tenants=tuple(rows), jobs=tuple(jobs))


def replay(
    snapshot: Snapshot,
    now: float,
    *,
    horizon_s: float,
    step_s: float,
    max_steps: int,
    policy: Policy | None = None,
    ratio: float = 1.0,
    overdue_s: float = OVERDUE_S,
) -> dict[str, float]:
    """Predicted starts of the snapshot's waiting jobs within the horizon, through the production core (a fresh
    ``Scheduler``, as the live queue view uses) unless ``policy`` is given; as the queue view's median forecast,
    with remaining run times scaled by the run-time predictor's median error ``ratio`` and overdue jobs ending
    ``overdue_s`` from now."""
    return estimate_starts(
        scaled(snapshot, now, ratio, overdue_s=overdue_s),
        now,
        policy or Scheduler().run_cycle,
        step_s=step_s,
        horizon_s=horizon_s,
        max_steps=max_steps,
        overdue_s=overdue_s,
    )


def forecast(
    snapshot: Snapshot,
    now: float,
    *,
    horizon_s: float,
    step_s: float,
    max_steps: int,
    ratio: float = 1.0,
    calibrator: WaitCalibrator | None = None,
    make_policy: Callable[[], Policy] | None = None,
    overdue_s: float = OVERDUE_S,
) -> dict[str, float]:
    """The most likely start of each waiting job within the horizon, as the live queue view makes it: the raw replay
    (learned run times as they are) calibrated by ``calibrator`` (earlier estimates' outcomes, per size class) where
    it has samples enough for the job's band; else (cold start) the replay with remaining run times scaled by the
    run-time predictor's median error ``ratio`` (replayed only when some job needs it)."""
    make = make_policy or (lambda: Scheduler().run_cycle)
    raw = replay(snapshot, now, horizon_s=horizon_s, step_s=step_s, max_steps=max_steps, policy=make(), ratio=1.0, overdue_s=overdue_s)
    done, rest = calibrate_starts(snapshot.pending, raw, now, calibrator)
    out = {job_id: median for job_id, (_, median, _) in done.items()}
    if rest:
        scaled_run = (
            raw
            if ratio == 1.0
            else replay(
                snapshot, now, horizon_s=horizon_s, step_s=step_s, max_steps=max_steps, policy=make(), ratio=ratio, overdue_s=overdue_s
            )
        )
        out.update((job_id, scaled_run[job_id]) for job_id in rest if job_id in scaled_run)
    return out


def what_if(
    snapshot: Snapshot,
    proposal: Proposal,
    now: float,
    *,
    horizon_s: float,
    step_s: float,
    max_steps: int,
    decayed: Mapping[str, Mapping[str, float]] | None = None,
    make_policy: Callable[[], Policy] | None = None,
    ratio: float = 1.0,
    calibrator: WaitCalibrator | None = None,
) -> WhatIf:
    """The future without and with the proposal, compared (the proposal is checked first: :class:`ProposalError`):
    each side's most likely starts as :func:`forecast` makes them (the same calibration on both sides)."""
    changed = apply(snapshot, proposal, now=now, decayed=decayed)

    def side(snap: Snapshot) -> dict[str, float]:
        return forecast(
            snap, now, horizon_s=horizon_s, step_s=step_s, max_steps=max_steps, ratio=ratio, calibrator=calibrator, make_policy=make_policy
        )

    before = side(snapshot)
    after = before if changed is snapshot else side(changed)
    return compare(snapshot, before, after, now=now, horizon_s=horizon_s)
