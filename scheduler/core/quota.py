"""Quotas with borrowing inside cohorts (SPEC R4.1), Kueue-style.

Per tenant and GPU type: ``nominal`` GPUs are guaranteed; up to ``borrow_limit`` more
may be borrowed from the tenant's cohort (None: no limit; no cohort: none); at most
``lend_limit`` of its idle nominal GPUs may be lent out (None: all of them).

A use is admissible when, after it:

1. the tenant uses at most ``nominal + borrow_limit`` of the type, and
2. if it uses more than ``nominal``, its cohort's borrowing stays covered by its lending:
   ``sum(max(0, used - nominal)) <= sum(min(lend_limit, max(0, nominal - used)))`` over
   the cohort's tenants for that type.

Without any tenant in the snapshot, quotas are off (every use is admissible); a tenant
missing from a snapshot that has tenants has no quota at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.core.types import Quota, RunningJob, TenantView

_NO_QUOTA = Quota(nominal=0, borrow_limit=0, lend_limit=0)
_BORROW_ONLY = Quota()


@dataclass(slots=True)
class _Tenant:
    name: str
    weight: float
    cohort: str | None
    quotas: dict[str, Quota]
    decayed: dict[str, float]
    used: dict[str, int] = field(default_factory=dict)
    #: Bumped on every change of ``used`` (lets callers cache what they derive from it).
    version: int = 0


class QuotaBook:
    """Usage per tenant and GPU type, and each cohort's borrowed and lendable totals."""

    def __init__(
        self, tenants: tuple[TenantView, ...], running: tuple[RunningJob, ...] = (), usage: dict[tuple[str, str], int] | None = None
    ) -> None:
        """Tenants, and what they use now: the running jobs, or ``usage`` already summed per (tenant, GPU type)."""
        self.enabled = bool(tenants)
        self._tenants: dict[str, _Tenant] = {}
        #: What ``sync_tenants`` compares the next views with: the views, and each tenant's fixed part.
        self._views_seen = tenants
        self._shapes: dict[str, tuple[float, str | None, tuple[tuple[str, Quota], ...]]] = {}
        #: Changes to undo (``undo``), while ``logging``.
        self._log: list[tuple[str, str, int]] = []
        self.logging = False
        for view in sorted(tenants, key=lambda t: t.name):
            self._tenants[view.name] = _Tenant(
                name=view.name,
                weight=view.weight if view.weight > 0 else 1.0,
                cohort=view.cohort,
                quotas=dict(view.quotas),
                decayed=dict(view.decayed_usage),
            )
            self._shapes[view.name] = (view.weight, view.cohort, view.quotas)
        #: (cohort, type) -> [borrowed, lendable now]
        self._cohorts: dict[tuple[str, str], list[int]] = {}
        self._members: dict[str, list[_Tenant]] = {}
        for tenant in self._tenants.values():
            if tenant.cohort is not None:
                self._members.setdefault(tenant.cohort, []).append(tenant)
        for tenant in self._tenants.values():
            if tenant.cohort is not None:
                for gpu_type in tenant.quotas:
                    self._cohort_totals(tenant.cohort, gpu_type)
        # Cohort totals depend only on each tenant's final use, so adding the sums is adding the jobs.
        for (name, gpu_type), gpus in sorted((usage if usage is not None else usage_of(running)).items()):
            self.add(name, gpu_type, gpus)

    def tenant(self, name: str) -> _Tenant:
        found = self._tenants.get(name)
        if found is None:
            found = _Tenant(name=name, weight=1.0, cohort=None, quotas={}, decayed={})
            self._tenants[name] = found
        return found

    def quota(self, name: str, gpu_type: str) -> Quota:
        tenant = self._tenants.get(name) or self.tenant(name)
        found = tenant.quotas.get(gpu_type)
        if found is None:
            # A type missing from a cohort member's quotas may still be borrowed; without a cohort, nothing.
            found = _NO_QUOTA if tenant.cohort is None else _BORROW_ONLY
        return found

    def used(self, name: str, gpu_type: str) -> int:
        return self.tenant(name).used.get(gpu_type, 0)

    def _cohort_totals(self, cohort: str, gpu_type: str) -> list[int]:
        totals = self._cohorts.get((cohort, gpu_type))
        if totals is None:
            totals = [0, 0]
            for tenant in self._members.get(cohort, ()):
                totals[1] += _lendable(self.quota(tenant.name, gpu_type), 0)
            self._cohorts[(cohort, gpu_type)] = totals
        return totals

    # ------------------------------------------------------------ changes

    def add(self, name: str, gpu_type: str, gpus: int) -> None:
        """Count ``gpus`` more (negative: fewer) of ``gpu_type`` against ``name``."""
        if self.logging:
            self._log.append((name, gpu_type, gpus))
        tenant = self.tenant(name)
        before = tenant.used.get(gpu_type, 0)
        after = before + gpus
        tenant.used[gpu_type] = after
        tenant.version += 1
        if tenant.cohort is None:
            return
        quota = self.quota(name, gpu_type)
        totals = self._cohort_totals(tenant.cohort, gpu_type)
        totals[0] += _borrowed(quota, after) - _borrowed(quota, before)
        totals[1] += _lendable(quota, after) - _lendable(quota, before)

    def undo(self) -> None:
        """Take back every change made while ``logging``, newest first, and stop logging."""
        self.logging = False
        while self._log:
            name, gpu_type, gpus = self._log.pop()
            self.add(name, gpu_type, -gpus)

    def sync_tenants(self, tenants: tuple[TenantView, ...]) -> bool:
        """Take the tenants' newly decayed usage; False when anything else about them changed (rebuild)."""
        if tenants is self._views_seen:
            return True
        if bool(tenants) != self.enabled or len(tenants) != len(self._shapes):
            return False
        names = set()
        for view in tenants:
            if self._shapes.get(view.name) != (view.weight, view.cohort, view.quotas):
                return False
            names.add(view.name)
        if len(names) != len(self._shapes):
            return False
        for view in tenants:
            self._tenants[view.name].decayed = dict(view.decayed_usage)
        self._views_seen = tenants
        return True

    # ------------------------------------------------------------ questions

    def admits(self, name: str, gpu_type: str, gpus: int) -> bool:
        """Would ``gpus`` more of ``gpu_type`` for ``name`` stay within quota (rules 1 and 2)?"""
        if not self.enabled:
            return True
        # Called for every queued job in every cycle: the helpers are written out here.
        tenant = self._tenants.get(name) or self.tenant(name)
        quota = tenant.quotas.get(gpu_type)
        cohort = tenant.cohort
        if quota is None:
            quota = _NO_QUOTA if cohort is None else _BORROW_ONLY
        nominal = quota.nominal
        before = tenant.used.get(gpu_type, 0)
        after = before + gpus
        if after <= nominal:
            return True
        if cohort is None:
            return False
        if quota.borrow_limit is not None and after > nominal + quota.borrow_limit:
            return False
        totals = self._cohorts.get((cohort, gpu_type)) or self._cohort_totals(cohort, gpu_type)
        # after > nominal: everything above the nominal is borrowed.
        borrowed = totals[0] + (after - nominal) - (before - nominal if before > nominal else 0)
        lendable = totals[1] + _lendable(quota, after) - _lendable(quota, before)
        return borrowed <= lendable

    def within_nominal(self, name: str, gpu_type: str, gpus: int) -> bool:
        """Would the tenant stay inside its guarantee? (What entitles it to reclaim.)"""
        if not self.enabled:
            return False
        tenant = self._tenants.get(name) or self.tenant(name)
        quota = tenant.quotas.get(gpu_type)
        nominal = quota.nominal if quota is not None else 0
        return tenant.used.get(gpu_type, 0) + gpus <= nominal

    def borrowing(self, name: str, gpu_type: str, minus: int = 0) -> bool:
        """Does the tenant use more than its nominal (after giving back ``minus``)?"""
        return self.used(name, gpu_type) - minus > self.quota(name, gpu_type).nominal


def usage_of(running: tuple[RunningJob, ...] | list[RunningJob]) -> dict[tuple[str, str], int]:
    """GPUs counted against each (tenant, GPU type): held, less elastic jobs' GPUs above their minimum."""
    usage: dict[tuple[str, str], int] = {}
    for job in running:
        key = (job.tenant, job.gpu_type)
        usage[key] = usage.get(key, 0) + job.entitled_gpus
    return usage


def _borrowed(quota: Quota, used: int) -> int:
    return max(0, used - quota.nominal)


def _lendable(quota: Quota, used: int) -> int:
    idle = max(0, quota.nominal - used)
    return idle if quota.lend_limit is None else min(quota.lend_limit, idle)
