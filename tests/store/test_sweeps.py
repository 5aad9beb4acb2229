"""Sweeps and their trials on both backends: one sweep per key, trials recorded once, a finished sweep never moves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from activities.sweeps import SweepActivities
from fairgang.settings import Settings, log_path
from fairgang.spec import JobState
from store import jobs, sweeps
from store.db import Database
from tests.builders import job_spec
from workflows.sweep_messages import FinishSweepInput


async def _sweep(db: Database, key: str = "k", **overrides: Any) -> tuple[Any, bool]:
    values: dict[str, Any] = dict(
        sweep_id=f"s-{key}", tenant="alpha", name="lr", idempotency_key=key, spec={"name": "lr"}, trial_count=2, max_concurrent=1
    )
    return await sweeps.create_sweep(db, **(values | overrides))


async def test_the_same_key_yields_one_sweep_per_tenant(seeded: Database) -> None:
    first, created = await _sweep(seeded, now=10.0)
    again, created_again = await _sweep(seeded, sweep_id="s-other", name="other")
    assert created and not created_again and again.id == first.id == "s-k"
    refused, _ = await _sweep(seeded, key="bad", state="FAILED", reason="no such GPU type", now=20.0)
    assert refused.finished_at == 20.0 and first.finished_at is None
    assert [s.id for s in await sweeps.list_sweeps(seeded, tenant="alpha")] == ["s-bad", "s-k"]
    assert [s.id for s in await sweeps.list_sweeps(seeded, state="FAILED")] == ["s-bad"]
    assert await sweeps.find_sweep_by_key(seeded, tenant="beta", key="k") is None


async def test_cancelling_never_goes_back_to_running_and_a_finished_sweep_never_moves(seeded: Database) -> None:
    await _sweep(seeded)
    await sweeps.set_sweep_state(seeded, sweep_id="s-k", state="CANCELLING")
    assert (await sweeps.set_sweep_state(seeded, sweep_id="s-k", state="RUNNING")).state == "CANCELLING"  # type: ignore[union-attr]
    done = await sweeps.set_sweep_state(seeded, sweep_id="s-k", state="CANCELLED", summary={"succeeded": 0}, reason="asked", now=30.0)
    assert done is not None and (done.state, done.summary, done.reason, done.finished_at) == ("CANCELLED", {"succeeded": 0}, "asked", 30.0)
    late = await sweeps.set_sweep_state(seeded, sweep_id="s-k", state="COMPLETED", now=40.0)
    assert late is not None and (late.state, late.finished_at) == ("CANCELLED", 30.0)
    assert await sweeps.set_sweep_state(seeded, sweep_id="s-none", state="RUNNING") is None


async def test_a_trial_is_recorded_once_and_listed_with_its_job(seeded: Database) -> None:
    await _sweep(seeded)
    job, _ = await jobs.create_job(seeded, spec=job_spec(name="lr-0"), tenant="alpha", job_id="s-k-0")
    first = await sweeps.add_trial(seeded, sweep_id="s-k", index=0, params={"lr": 0.1}, job_id=job.id)
    again = await sweeps.add_trial(seeded, sweep_id="s-k", index=0, params={"lr": 9.9}, job_id=None, state="REFUSED")
    assert (again.params, again.job_id, again.state) == (first.params, job.id, "CREATED") == ({"lr": 0.1}, "s-k-0", "CREATED")
    await sweeps.add_trial(seeded, sweep_id="s-k", index=1, params={"lr": 0.2}, job_id=None, state="REFUSED", reason="too many GPUs")
    await sweeps.set_trial_metrics(seeded, sweep_id="s-k", index=0, metrics={"loss": 0.5})
    listed = await sweeps.sweep_trials(seeded, "s-k")
    assert [(t.index, t.state, t.metrics, j.id if j else None) for t, j in listed] == [
        (0, "CREATED", {"loss": 0.5}, "s-k-0"),
        (1, "REFUSED", {}, None),
    ]
    trial = await sweeps.get_trial(seeded, sweep_id="s-k", index=1)
    assert trial is not None and trial.reason == "too many GPUs"


async def test_a_sweep_whose_trials_logs_cannot_be_read_says_so(seeded: Database, tmp_path: Path) -> None:
    """The worker must read the trials' logs (the agents' FAIRGANG_LOG_DIR): without them the sweep names the
    trials whose metrics it could not read, instead of ending without a best trial and no word why."""
    await _sweep(seeded, spec={"name": "lr", "metric": {"name": "loss", "goal": "minimize"}})
    for index in (0, 1):
        job, _ = await jobs.create_job(seeded, spec=job_spec(name=f"lr-{index}"), tenant="alpha")
        await jobs.record_transition(seeded, job_id=job.id, attempt=1, state=JobState.SUCCEEDED, event_key="end-1")
        await sweeps.add_trial(seeded, sweep_id="s-k", index=index, params={"lr": index}, job_id=job.id)
        if index == 0:  # only trial 0's log is where the worker looks
            path = log_path(tmp_path, job.id, 1, 0)
            path.parent.mkdir(parents=True)
            path.write_text("FAIRGANG_METRIC loss=0.5\n")
    finish = SweepActivities(seeded, Settings(database_url=seeded.url, log_dir=tmp_path)).finish_sweep
    result = await finish(FinishSweepInput(sweep_id="s-k", cancelled=False))
    assert result["best"]["index"] == 0 and [u["index"] for u in result["metrics_unreadable"]] == [1]
    assert "FileNotFoundError" in result["metrics_unreadable"][0]["error"]
    done = await sweeps.get_sweep(seeded, "s-k")
    assert done is not None and done.reason is not None and "the metrics of 1 trial(s) could not be read" in done.reason
