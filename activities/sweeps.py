"""Sweep activities, run by the control-plane worker. Each is idempotent.

A trial is admitted exactly like ``POST /v1/jobs``: the tenant's policy and the fleet's
shapes (:func:`fairgang.admission.check_admission`), then ``store.jobs.create_job`` with the
tenant's concurrent-job cap (:func:`fairgang.admission.job_cap_problem`), under the
deterministic id ``<sweep id>-<index>``. A scheduled run's sweep is admitted as a whole by
:func:`fairgang.admission.check_sweep_admission`.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

from temporalio import activity

from fairgang.admission import check_admission, check_sweep_admission
from fairgang.settings import Settings, log_path
from fairgang.spec import SpecError
from fairgang.sweeps import SweepSpec, parse_metrics, parse_sweep, trial_job_id
from store import jobs, tenants
from store import sweeps as stored_sweeps
from store.db import Database
from store.models import Sweep
from workflows import starter
from workflows.sweep_messages import (
    FinishSweepInput,
    OpenSweepInput,
    OpenSweepResult,
    TrialInput,
    TrialStart,
    TrialStates,
    TrialStatesInput,
)

log = logging.getLogger("fairgang.sweeps")


def scheduled_sweep_id(workflow_id: str, run_id: str = "") -> str:
    """The sweep id of a scheduled run: derived from its workflow (id and first run), so a retry finds the same sweep.

    Temporal names a schedule's run after the schedule and the second it started: two actions
    within one second (triggers, a cancel-previous restart) share a workflow id, not a run id.
    """
    return "sw-" + hashlib.sha256(f"{workflow_id}@{run_id}".encode() if run_id else workflow_id.encode()).hexdigest()[:12]


def scheduled_run_key(workflow_id: str, run_id: str = "") -> str:
    """The idempotency key of a scheduled run's sweep; :func:`scheduled_workflow_id` reads the workflow id back."""
    return f"run:{workflow_id}@{run_id}" if run_id else f"run:{workflow_id}"


def scheduled_workflow_id(idempotency_key: str) -> str | None:
    """The workflow id of a scheduled run's sweep (None for a submitted sweep, whose workflow id is its id)."""
    if not idempotency_key.startswith("run:"):
        return None
    return idempotency_key.removeprefix("run:").split("@", 1)[0]


def sweep_summary(sweep: Sweep, trials: list[tuple[Any, Any]], *, cancelled: bool) -> dict[str, Any]:
    """Trials by outcome and the best one by the spec's metric (when the jobs reported it)."""
    counts = {"succeeded": 0, "failed": 0, "cancelled": 0, "timed_out": 0, "refused": 0, "unfinished": 0}
    for _trial, job in trials:
        if job is None:
            counts["refused"] += 1
        elif job.state.lower() in counts:
            counts[job.state.lower()] += 1
        else:
            counts["unfinished"] += 1
    summary: dict[str, Any] = {
        "trials": sweep.trial_count,
        "started": len(trials),
        **counts,
        "not_started": sweep.trial_count - len(trials),
    }
    metric = (sweep.spec.get("metric") or {}) if isinstance(sweep.spec, dict) else {}
    best = None
    if metric.get("name"):
        name, goal = metric["name"], metric.get("goal", "minimize")
        scored = [(t.metrics[name], t.index, t, j) for t, j in trials if j is not None and j.state == "SUCCEEDED" and name in t.metrics]
        if scored:
            value, _, trial, job = min(scored, key=lambda s: (s[0] if goal == "minimize" else -s[0], s[1]))
            best = {"index": trial.index, "job_id": job.id, "metric": name, "goal": goal, "value": value, "params": trial.params}
        summary["metric"] = {"name": name, "goal": goal}
    summary["best"] = best
    summary["cancelled_sweep"] = cancelled
    return summary


class SweepActivities:
    """Sweep bookkeeping in the store: open the sweep, admit and create trials, summarise."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.settings = settings

    @activity.defn(name="open_sweep")
    async def open_sweep(self, inp: OpenSweepInput) -> OpenSweepResult:
        if inp.sweep_id is not None:
            sweep = await stored_sweeps.get_sweep(self.db, inp.sweep_id)
            if sweep is None:
                raise RuntimeError(f"no sweep {inp.sweep_id}")
        else:
            sweep = await self._create_scheduled(inp)
        if sweep.state == "SUBMITTED":
            sweep = await stored_sweeps.set_sweep_state(self.db, sweep_id=sweep.id, state="RUNNING") or sweep
        return OpenSweepResult(sweep_id=sweep.id, trial_count=sweep.trial_count, max_concurrent=sweep.max_concurrent, state=sweep.state)

    async def _create_scheduled(self, inp: OpenSweepInput) -> Sweep:
        """A scheduled run's sweep, validated again now (the tenant's policy may have changed since)."""
        doc = dict(inp.spec or {}) | {"tenant": inp.tenant}
        sweep_id = scheduled_sweep_id(inp.workflow_id, inp.run_id)
        key = scheduled_run_key(inp.workflow_id, inp.run_id)
        name = str(doc.get("name") or "scheduled")
        try:
            spec = parse_sweep(doc)
            problems = await self._admission_problems(spec, inp.tenant)
        except SpecError as err:
            problems = [f"{p.field}: {p.reason}" for p in err.problems]
        if problems:
            sweep, _ = await stored_sweeps.create_sweep(
                self.db, sweep_id=sweep_id, tenant=inp.tenant, name=name[:64], idempotency_key=key, spec=doc, trial_count=0,
                max_concurrent=1, schedule_id=inp.schedule_id, state="FAILED", reason="; ".join(problems)[:1024],
            )  # fmt: skip
            return sweep
        sweep, _ = await stored_sweeps.create_sweep(
            self.db, sweep_id=sweep_id, tenant=inp.tenant, name=spec.name, idempotency_key=key,
            spec=spec.model_dump(mode="json", by_alias=True, exclude_none=True), trial_count=len(spec.trial_params()),
            max_concurrent=spec.max_concurrent, schedule_id=inp.schedule_id,
        )  # fmt: skip
        return sweep

    async def _admission_problems(self, spec: SweepSpec, tenant_name: str) -> list[str]:
        tenant = await tenants.get_tenant(self.db, tenant_name)
        if tenant is None:
            return [f"tenant: unknown tenant '{tenant_name}'"]
        problems = check_sweep_admission(spec, tenants.tenant_policy(tenant), await tenants.fleet_shape(self.db))
        return [f"template.{p.field}: {p.reason}" for p in problems]

    @activity.defn(name="create_trial")
    async def create_trial(self, inp: TrialInput) -> TrialStart:
        """Admit and store trial ``index``'s job (once); the workflow then starts it as its child."""
        existing = await stored_sweeps.get_trial(self.db, sweep_id=inp.sweep_id, index=inp.index)
        if existing is not None and existing.job_id is None:
            return TrialStart(status="refused", reason=existing.reason or "")
        sweep = await stored_sweeps.get_sweep(self.db, inp.sweep_id)
        if sweep is None:
            raise RuntimeError(f"no sweep {inp.sweep_id}")
        spec = SweepSpec.model_validate(sweep.spec)
        params = spec.trial_params()[inp.index]
        job_id = trial_job_id(sweep.id, inp.index)
        tenant = await tenants.get_tenant(self.db, sweep.tenant)
        assert tenant is not None
        try:
            job_spec = spec.trial_spec(inp.index, params, sweep_id=sweep.id, tenant=sweep.tenant)
            problems = [
                f"{p.field}: {p.reason}"
                for p in check_admission(job_spec, tenants.tenant_policy(tenant), await tenants.fleet_shape(self.db))
            ]
        except SpecError as err:
            problems = [str(err)]
        if problems:
            reason = "; ".join(problems)[:1024]
            await stored_sweeps.add_trial(
                self.db, sweep_id=sweep.id, index=inp.index, params=params, job_id=None, state="REFUSED", reason=reason
            )
            return TrialStart(status="refused", reason=reason)
        try:
            job, _ = await jobs.create_job(
                self.db, spec=job_spec, tenant=sweep.tenant, max_concurrent_jobs=tenant.max_concurrent_jobs, job_id=job_id
            )
        except jobs.AdmissionRefused as err:
            return TrialStart(status="wait", reason=err.reason)
        await stored_sweeps.add_trial(self.db, sweep_id=sweep.id, index=inp.index, params=params, job_id=job.id)
        return TrialStart(status="created", job_id=job.id, job=starter.job_input(job, self.settings))

    @activity.defn(name="trial_states")
    async def trial_states(self, inp: TrialStatesInput) -> TrialStates:
        return TrialStates(states=await jobs.job_states(self.db, inp.job_ids))

    @activity.defn(name="finish_sweep")
    async def finish_sweep(self, inp: FinishSweepInput) -> dict[str, Any]:
        """Read the trials' reported metrics, write the summary and the sweep's final state."""
        sweep = await stored_sweeps.get_sweep(self.db, inp.sweep_id)
        if sweep is None:
            raise RuntimeError(f"no sweep {inp.sweep_id}")
        trials = await stored_sweeps.sweep_trials(self.db, sweep.id)
        unreadable: list[dict[str, Any]] = []
        for trial, job in trials:
            if job is not None and not trial.metrics:
                try:
                    metrics = read_metrics(Path(self.settings.log_dir), job.id, job.attempt)
                except OSError as err:
                    if job.state == "SUCCEEDED":  # its metrics count: say why they are missing
                        unreadable.append({"index": trial.index, "job_id": job.id, "error": f"{type(err).__name__}: {err}"})
                    continue
                if metrics:
                    await stored_sweeps.set_trial_metrics(self.db, sweep_id=sweep.id, index=trial.index, metrics=metrics)
                    trial.metrics = metrics
        summary = sweep_summary(sweep, trials, cancelled=inp.cancelled)
        reason = inp.reason or None
        if unreadable:
            # Not a silent "no best trial": the worker could not read the trials' logs (FAIRGANG_LOG_DIR must be
            # the agents' log dir, shared with this process).
            summary["metrics_unreadable"] = unreadable
            note = f"the metrics of {len(unreadable)} trial(s) could not be read from {self.settings.log_dir}: {unreadable[0]['error']}"
            log.warning("sweep %s: %s", sweep.id, note)
            reason = f"{reason}; {note}" if reason else note
        state = "CANCELLED" if inp.cancelled else "COMPLETED"
        await stored_sweeps.set_sweep_state(self.db, sweep_id=sweep.id, state=state, summary=summary, reason=reason)
        return {"sweep_id": sweep.id, "state": state, **summary}

    def all(self) -> list[object]:
        return [self.open_sweep, self.create_trial, self.trial_states, self.finish_sweep]


def read_metrics(log_dir: Path, job_id: str, attempt: int) -> dict[str, float]:
    """Metrics from rank 0's log of the job's last attempt (``FAIRGANG_METRIC name=value`` lines).

    Raises:
        OSError: the log cannot be read (missing, or this process may not read it).
    """
    return parse_metrics(log_path(log_dir, job_id, attempt, 0).read_text(errors="replace"))
