"""A job's spec as the store keeps it (``JobSpec.stored``) loads back into an equal model (``stored_spec``), and the
workflow's input and the core's facts built from it are what they were when both read the stored dict key by key
(``job_input_by_keys`` and ``facts_by_keys`` below are those readers, kept here as the reference).

Rows written by earlier versions may lack optional keys, or hold what a submission limit added since refuses:
both still load.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fairgang.settings import Settings
from fairgang.spec import JobSpec, SpecError, load_spec_text, parse_spec, stored_spec
from scheduler.snapshot import JobFacts, job_facts
from tests.builders import spec_dict
from workflows.messages import JobInput
from workflows.starter import job_input

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "jobs").glob("*.yaml"))
SETTINGS = Settings(activity_heartbeat_timeout_s=7.0, infra_retry_limit=3, infra_retry_backoff_s=1.5, launch_start_timeout_s=40.0)


def job_input_by_keys(job: Any, settings: Settings) -> JobInput:
    spec = job.spec
    return JobInput(
        job_id=job.id,
        tenant=job.tenant,
        gpu_type=job.gpu_type,
        gpu_count=job.gpu_count,
        argv=list(spec["entrypoint"]),
        env=dict(spec.get("env") or {}),
        checkpoint_dir=spec["checkpoint_dir"],
        max_runtime_s=float(spec["max_runtime"]),
        grace_period_s=float(spec["grace_period"]),
        image=str(spec.get("image") or "local"),
        retries=int(spec.get("retries", 0)),
        heartbeat_timeout_s=settings.activity_heartbeat_timeout_s,
        infra_retry_limit=settings.infra_retry_limit,
        infra_retry_backoff_s=settings.infra_retry_backoff_s,
        launch_start_timeout_s=settings.launch_start_timeout_s,
        self_fence_after_s=settings.self_fence_after_s,
    )


def facts_by_keys(spec: dict[str, Any]) -> JobFacts:
    topology = spec.get("topology") or {}
    return JobFacts(
        topology_level=topology.get("level", "any"),
        topology_required=topology.get("mode", "required") == "required",
        max_runtime_s=float(spec.get("max_runtime") or 3600.0),
        preemptible=bool(spec.get("preemptible", True)),
        name=str(spec.get("name", "")),
    )


def row(spec: JobSpec, stored: dict[str, Any]) -> SimpleNamespace:
    """A job row as the store writes it (the JSON column's round trip included)."""
    return SimpleNamespace(
        id="j-1",
        tenant=stored.get("tenant", "alpha"),
        gpu_type=spec.gpu_type,
        gpu_count=spec.gpu_count,
        spec=json.loads(json.dumps(stored)),
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_round_trips_and_builds_what_it_built_before(path: Path) -> None:
    spec = load_spec_text(path.read_text())
    tenant = spec.tenant or "vision"
    job = row(spec, spec.stored(tenant))
    # The model back, but for what the store keeps elsewhere (the idempotency key) and fills in (the tenant).
    assert stored_spec(job.spec) == spec.model_copy(update={"tenant": tenant, "idempotency_key": None})
    assert stored_spec(spec.model_dump()) == spec
    assert job_input(job, SETTINGS) == job_input_by_keys(job, SETTINGS)
    assert job_facts(stored_spec(job.spec)) == facts_by_keys(job.spec)


def test_the_examples_are_there() -> None:
    assert {p.stem for p in EXAMPLES} >= {"vision-resnet", "nlp-llama", "speech-whisper"}


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"env": {"A": "1"}, "image": "registry/train:1", "retries": 3, "grace_period": "5s", "preemptible": False},
        {"topology": {"level": "spine", "mode": "preferred"}, "max_runtime": 90, "labels": {"team": "x"}},
        {"topology": {"level": "node"}, "priority_class": "urgent", "idempotency_key": "k-1"},
    ],
)
def test_every_field_builds_what_it_built_before(overrides: dict[str, Any]) -> None:
    spec = JobSpec.model_validate(spec_dict(**overrides))
    job = row(spec, spec.stored("alpha"))
    assert job_input(job, SETTINGS) == job_input_by_keys(job, SETTINGS)
    assert job_facts(stored_spec(job.spec)) == facts_by_keys(job.spec)


OPTIONAL = [name for name, field in JobSpec.model_fields.items() if not field.is_required()]


@pytest.mark.parametrize("missing", OPTIONAL)
def test_a_row_without_an_optional_key_loads_with_the_models_default(missing: str) -> None:
    full = JobSpec.model_validate(spec_dict(env={"A": "1"}, retries=2, topology={"level": "leaf"})).stored("alpha")
    older = {k: v for k, v in full.items() if k != missing}
    loaded = stored_spec(older)
    assert getattr(loaded, missing) == JobSpec.model_fields[missing].get_default(call_default_factory=True)
    if missing != "grace_period":  # the key-by-key reader needed that one
        job = row(loaded, older)
        assert job_input(job, SETTINGS) == job_input_by_keys(job, SETTINGS)
        assert job_facts(loaded) == facts_by_keys(older)


def test_a_row_that_a_later_submission_limit_refuses_still_loads() -> None:
    """A spec stored before a limit was added (here: more arguments, and a control character, than a submission may
    carry today) is the job's, queued or running: reading it back must not fail."""
    stored = JobSpec.model_validate(spec_dict()).stored("alpha") | {"entrypoint": ["python3", *["x"] * 5000, "a\x01b"]}
    with pytest.raises(SpecError):
        parse_spec(stored)
    assert stored_spec(stored).entrypoint == stored["entrypoint"]


def test_a_stored_spec_is_still_a_spec() -> None:
    """Loading skips the submission limits, not the model's shape: a row that is no spec is an error."""
    with pytest.raises(ValueError, match="gpu_count"):
        stored_spec(JobSpec.model_validate(spec_dict()).stored("alpha") | {"gpu_count": "many"})
