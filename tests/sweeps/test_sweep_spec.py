"""The sweep and schedule specs: expansion, substitution, and refusals that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.client import ScheduleOverlapPolicy

from activities.sweeps import scheduled_run_key, scheduled_sweep_id, scheduled_workflow_id, sweep_summary
from api.sweeps import OVERLAP
from fairgang.spec import SpecError
from fairgang.sweeps import OVERLAP_POLICIES, load_schedule_text, load_sweep_text, parse_metrics, parse_schedule, parse_sweep, trial_job_id
from store.models import Sweep

REPO = Path(__file__).resolve().parents[2]


def sweep_doc(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "lr",
        "max_concurrent": 2,
        "parameters": {"grid": {"lr": [0.1, 0.01, 0.001], "features": [8, 16]}},
        "template": {
            "entrypoint": ["python3", "train.py", "--lr", "{{lr}}", "--features={{ features }}"],
            "env": {"LR": "{{lr}}"},
            "gpu_type": "H100-80GB",
            "gpu_count": 1,
            "max_runtime": "10m",
            "checkpoint_dir": "/ckpt/alpha/lr",
        },
    }
    doc.update(extra)
    return doc


def fields_of(doc: Any) -> set[str]:
    with pytest.raises(SpecError) as err:
        parse_sweep(doc)
    return {p.field for p in err.value.problems}


def test_grid_expands_to_the_cartesian_product_first_key_slowest() -> None:
    spec = parse_sweep(sweep_doc())
    params = spec.trial_params()
    assert params == [
        {"lr": 0.1, "features": 8},
        {"lr": 0.1, "features": 16},
        {"lr": 0.01, "features": 8},
        {"lr": 0.01, "features": 16},
        {"lr": 0.001, "features": 8},
        {"lr": 0.001, "features": 16},
    ]


def test_trial_spec_substitutes_argv_and_env_and_gets_its_own_name_key_and_checkpoint_dir() -> None:
    spec = parse_sweep(sweep_doc())
    job = spec.trial_spec(3, spec.trial_params()[3], sweep_id="sw-abc", tenant="alpha")
    assert job.entrypoint == ["python3", "train.py", "--lr", "0.01", "--features=16"]
    assert job.env == {"LR": "0.01", "FAIRGANG_SWEEP_ID": "sw-abc", "FAIRGANG_TRIAL": "3"}
    assert job.name == "lr-0003" and job.tenant == "alpha"
    assert job.idempotency_key == "sweep:sw-abc:3"
    assert job.checkpoint_dir == "/ckpt/alpha/lr/trial-0003"
    assert job.labels == {"fairgang.sweep": "sw-abc", "fairgang.trial": "3"}
    assert trial_job_id("sw-abc", 3) == "sw-abc-0003"


def test_explicit_list_keeps_its_order() -> None:
    spec = parse_sweep(sweep_doc(parameters={"list": [{"lr": 1, "features": 2}, {"lr": 3, "features": 4}]}))
    assert spec.trial_params() == [{"lr": 1, "features": 2}, {"lr": 3, "features": 4}]


def test_random_search_is_reproducible_from_its_seed_and_stays_in_bounds() -> None:
    space = {"lr": {"log_uniform": [1e-4, 1e-1]}, "features": {"choice": [8, 16, 32]}}
    doc = sweep_doc(parameters={"random": {"seed": 7, "samples": 20, "space": space}})
    first, again = parse_sweep(doc).trial_params(), parse_sweep(doc).trial_params()
    assert first == again and len(first) == 20
    assert all(1e-4 <= float(p["lr"]) <= 1e-1 and p["features"] in (8, 16, 32) for p in first)
    other = parse_sweep(sweep_doc(parameters={"random": {"seed": 8, "samples": 20, "space": space}})).trial_params()
    assert other != first


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"name": "Bad Name"}, "name"),
        ({"surprise": 1}, "surprise"),
        ({"parameters": {"grid": {"lr": []}}}, "parameters.grid"),
        ({"parameters": {"grid": {"lr": [1]}, "list": [{"lr": 1}]}}, "parameters"),
        ({"parameters": {"random": {"seed": 1, "samples": 3, "space": {"lr": {"uniform": [2, 1]}}}}}, "parameters.random.space.lr"),
        ({"metric": {"name": "loss", "goal": "biggest"}}, "metric.goal"),
    ],
)
def test_invalid_sweeps_are_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    assert field in fields_of(sweep_doc(**change))


def test_template_problems_are_named_under_template() -> None:
    doc = sweep_doc()
    doc["template"] = dict(doc["template"], name="x")
    assert fields_of(doc) == {"template.name"}
    doc = sweep_doc()
    doc["template"] = dict(doc["template"], gpu_count=0, checkpoint_dir="relative")
    assert fields_of(doc) == {"template.gpu_count", "template.checkpoint_dir"}


def test_unknown_placeholders_and_unused_parameters_are_refused() -> None:
    doc = sweep_doc()
    doc["template"] = dict(doc["template"], entrypoint=["python3", "{{lr}}", "{{momentum}}"], env={})
    assert fields_of(doc) == {"template.entrypoint.2", "parameters.grid.features"}


def test_grids_over_the_trial_limit_are_refused() -> None:
    grid = {f"p{i}": list(range(10)) for i in range(5)}
    doc = sweep_doc(parameters={"grid": grid})
    doc["template"] = dict(doc["template"], entrypoint=["x", *[f"{{{{p{i}}}}}" for i in range(5)]], env={})
    assert "parameters" in fields_of(doc)


def test_metrics_are_read_from_fairgang_metric_lines_last_value_wins() -> None:
    log = "step 1\nFAIRGANG_METRIC loss=0.5 acc=0.7\nnoise FAIRGANG_METRIC loss=9\nFAIRGANG_METRIC loss=0.25 bad=x\n"
    assert parse_metrics(log) == {"loss": 0.25, "acc": 0.7}


def test_summary_picks_the_best_succeeded_trial_by_the_metric() -> None:
    class Row:
        def __init__(self, index: int, metrics: dict[str, float], state: str | None) -> None:
            self.index, self.metrics, self.params = index, metrics, {"lr": index}
            self.job = None if state is None else type("J", (), {"id": f"j{index}", "state": state})()

    sweep = Sweep(id="sw-1", tenant="alpha", name="s", idempotency_key="k", spec={"metric": {"name": "acc", "goal": "maximize"}},
                  trial_count=5, max_concurrent=1, created_at=0, updated_at=0)  # fmt: skip
    rows = [Row(0, {"acc": 0.5}, "SUCCEEDED"), Row(1, {"acc": 0.9}, "SUCCEEDED"), Row(2, {"acc": 0.99}, "FAILED"), Row(3, {}, None)]
    summary = sweep_summary(sweep, [(r, r.job) for r in rows], cancelled=False)
    assert (summary["succeeded"], summary["failed"], summary["refused"], summary["not_started"]) == (2, 1, 1, 1)
    assert summary["best"]["index"] == 1 and summary["best"]["value"] == 0.9


def test_schedule_needs_exactly_one_of_cron_and_interval_and_names_sweep_fields() -> None:
    base: dict[str, Any] = {"name": "nightly", "schedule": {"interval": "30m"}, "sweep": sweep_doc()}
    schedule, sweep = parse_schedule(base)
    assert schedule.schedule.interval == 1800 and schedule.overlap == "skip" and sweep.name == "lr"
    cases: list[tuple[dict[str, Any], str]] = [
        ({"schedule": {"interval": "30m", "cron": "0 2 * * *"}}, "schedule"),
        ({"schedule": {"cron": "every day"}}, "schedule.cron"),
        ({"overlap": "sometimes"}, "overlap"),
        ({"sweep": sweep_doc(max_concurrent=-1)}, "sweep.max_concurrent"),
    ]
    for bad, field in cases:
        with pytest.raises(SpecError) as err:
            parse_schedule(base | bad)
        assert field in {p.field for p in err.value.problems}, err.value


def test_examples_are_valid() -> None:
    spec = load_sweep_text((REPO / "examples/sweeps/lr-features.yaml").read_text())
    assert len(spec.trial_params()) == 6 and spec.max_concurrent == 2
    schedule, _ = load_schedule_text((REPO / "examples/sweeps/nightly-schedule.yaml").read_text())
    assert schedule.schedule.cron == "0 2 * * *"


def test_scheduled_sweep_ids_are_stable_and_short() -> None:
    a = scheduled_sweep_id("sched-alpha-nightly-2026-01-01T02:00:00Z")
    assert a == scheduled_sweep_id("sched-alpha-nightly-2026-01-01T02:00:00Z") != scheduled_sweep_id("sched-alpha-nightly-x")
    assert len(trial_job_id(a, 9999)) <= 40


def test_two_runs_under_one_scheduled_workflow_id_are_two_sweeps() -> None:
    """Temporal names a scheduled run after the second it started: two triggers within one second share it."""
    wf = "sched-alpha-nightly-2026-01-01T02:00:00Z"
    first, second = scheduled_sweep_id(wf, "run-1"), scheduled_sweep_id(wf, "run-2")
    assert first != second and first == scheduled_sweep_id(wf, "run-1")
    assert scheduled_run_key(wf, "run-1") != scheduled_run_key(wf, "run-2")
    for key in (scheduled_run_key(wf, "run-1"), scheduled_run_key(wf)):
        assert scheduled_workflow_id(key) == wf
    assert scheduled_workflow_id("name:nightly") is None


@pytest.mark.parametrize(
    ("name", "policy"),
    [
        ("skip", ScheduleOverlapPolicy.SKIP),
        ("buffer_one", ScheduleOverlapPolicy.BUFFER_ONE),
        ("cancel_previous", ScheduleOverlapPolicy.CANCEL_OTHER),
    ],
)
def test_each_overlap_policy_maps_to_its_temporal_policy(name: str, policy: ScheduleOverlapPolicy) -> None:
    assert OVERLAP[name] == policy
    assert parse_schedule({"name": "n", "schedule": {"interval": "1h"}, "overlap": name, "sweep": sweep_doc()})[0].overlap == name


def test_the_overlap_policies_are_exactly_the_documented_three() -> None:
    assert set(OVERLAP) == set(OVERLAP_POLICIES) == {"skip", "buffer_one", "cancel_previous"}
    assert len(set(OVERLAP.values())) == 3
