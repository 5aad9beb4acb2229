"""The job contract (R1.1/R1.2) and admission (R2.1): every refusal names its field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairgang.admission import FleetShape, TenantPolicy, check_admission, check_sweep_admission, gang_fits_shape, job_cap_problem
from fairgang.cluster import ClusterConfig
from fairgang.durations import format_duration, parse_duration
from fairgang.spec import SpecError, load_spec_text, parse_spec
from fairgang.sweeps import parse_sweep
from tests.builders import job_spec, spec_dict

FLEET = FleetShape(shapes={"H100-80GB": {8: 2}, "L40S": {4: 1}}, levels=frozenset({"node", "leaf", "spine"}))
ALPHA = TenantPolicy(
    name="alpha",
    allowed_gpu_types=frozenset({"H100-80GB"}),
    max_gpus_per_job=16,
    max_runtime_s=24 * 3600,
    checkpoint_prefix="/ckpt/alpha",
)


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"name": "Bad Name!"}, "name", "lower-case"),
        ({"entrypoint": []}, "entrypoint", "at least 1"),
        ({"entrypoint": "python train.py"}, "entrypoint", "list"),
        ({"gpu_count": 0}, "gpu_count", "greater than or equal to 1"),
        ({"max_runtime": "soon"}, "max_runtime", "not a duration"),
        ({"max_runtime": -5}, "max_runtime", "longer than zero"),
        ({"checkpoint_dir": "relative/path"}, "checkpoint_dir", "absolute"),
        ({"checkpoint_dir": "/ckpt/alpha/../beta"}, "checkpoint_dir", ".."),
        ({"priority_class": "vip"}, "priority_class", "unknown priority class"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env", "set by the platform"),
        ({"env": {"1BAD": "x"}}, "env", "not a valid environment variable"),
        ({"topology": {"level": "leaf", "mode": "maybe"}}, "topology.mode", "'required' or 'preferred'"),
        ({"gpus": 3}, "gpus", "unknown field"),
        ({"gpu_count": {"min": 16, "max": 8}}, "gpu_count", "min (16) is more than max (8)"),
        ({"gpu_count": {"min": 0, "max": 8}}, "gpu_count.min", "greater than or equal to 1"),
        ({"gpu_count": {"min": 8}}, "gpu_count.max", "Field required"),
        ({"gpu_count": {"min": 8, "max": 16, "step": 8}}, "gpu_count.step", "unknown field"),
        ({"gpu_type": None}, "gpu_type", "Field required"),
    ],
)
def test_bad_spec_names_the_field(overrides: dict, field: str, reason: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(spec_dict(**overrides))
    fields = {p.field: p.reason for p in err.value.problems}
    assert field in fields, fields
    assert reason in fields[field]


def test_spec_reads_yaml_and_json_alike() -> None:
    yaml_text = (
        "name: t\nentrypoint: [python3, train.py]\ngpu_type: H100-80GB\ngpu_count: 8\nmax_runtime: 2h\ncheckpoint_dir: /ckpt/alpha/t\n"
    )
    from_yaml = load_spec_text(yaml_text)
    from_json = load_spec_text(from_yaml.model_dump_json())
    assert from_yaml == from_json
    assert from_yaml.max_runtime == 7200 and from_yaml.grace_period == 30 and from_yaml.preemptible


def test_spec_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(SpecError, match=r"\(spec\)"):
        load_spec_text("- just\n- a list\n")


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"gpu_type": "TPU-v5"}, "gpu_type", "unknown GPU type 'TPU-v5'"),
        ({"gpu_type": "L40S", "checkpoint_dir": "/ckpt/alpha/x"}, "gpu_type", "may not use L40S"),
        ({"gpu_count": 12}, "gpu_count", "12 H100-80GB GPUs is not whole nodes: a job larger than one node takes whole nodes"),
        ({"gpu_count": 24}, "gpu_count", "24 H100-80GB GPUs is more than the fleet has: 16 in all"),
        ({"max_runtime": "30h"}, "max_runtime", "over tenant 'alpha' limit of 1d"),
        ({"checkpoint_dir": "/ckpt/beta/x"}, "checkpoint_dir", "/ckpt/alpha"),
        ({"checkpoint_dir": "/ckpt/alphabet"}, "checkpoint_dir", "/ckpt/alpha"),
        ({"topology": {"level": "rack"}}, "topology.level", "unknown topology level"),
        ({"gpu_count": 16, "topology": {"level": "node"}}, "topology.level", "do not fit on one node"),
        ({"gpu_count": {"min": 8, "max": 24}}, "gpu_count.max", "24 H100-80GB GPUs is more than the fleet has: 16 in all"),
        ({"gpu_count": {"min": 12, "max": 16}}, "gpu_count.min", "12 H100-80GB GPUs is not whole nodes"),
        ({"gpu_count": {"min": 4, "max": 16}}, "gpu_count.min", "grows and shrinks by whole nodes: min (4) and max (16)"),
        ({"gpu_count": {"min": 4, "max": 16}, "topology": {"level": "node"}}, "topology.level", "16 GPUs do not fit on one node"),
    ],
)
def test_admission_refusal_names_the_field(overrides: dict, field: str, reason: str) -> None:
    problems = check_admission(job_spec(**overrides), ALPHA, FLEET)
    assert any(p.field == field and reason in p.reason for p in problems), problems


@pytest.mark.parametrize("count", [{"min": 2, "max": 8}, {"min": 8, "max": 16}, {"min": 4, "max": 4}])
def test_an_elastic_range_in_steps_the_fleet_allows_is_admitted(count: dict) -> None:
    spec = job_spec(gpu_count=count)
    assert check_admission(spec, ALPHA, FLEET) == []
    assert (spec.min_gpus, spec.max_gpus, spec.elastic) == (count["min"], count["max"], count["max"] > count["min"])


def test_an_elastic_jobs_maximum_is_held_to_the_tenants_gpus_per_job() -> None:
    tight = TenantPolicy(name="t", allowed_gpu_types=frozenset(), max_gpus_per_job=8, max_runtime_s=3600, checkpoint_prefix="/ckpt")
    problems = check_admission(job_spec(gpu_count={"min": 8, "max": 16}, checkpoint_dir="/ckpt/x"), tight, FLEET)
    assert [(p.field, p.reason) for p in problems] == [("gpu_count.max", "16 is over tenant 't' limit of 8 GPUs per job")]


def test_admission_over_max_gpus_per_job() -> None:
    tight = TenantPolicy(name="t", allowed_gpu_types=frozenset(), max_gpus_per_job=4, max_runtime_s=3600, checkpoint_prefix="/ckpt")
    problems = check_admission(job_spec(gpu_count=8), tight, FLEET)
    assert [p.field for p in problems] == ["gpu_count"]
    assert "limit of 4 GPUs per job" in problems[0].reason


def test_a_tenant_without_a_checkpoint_prefix_keeps_its_checkpoints_under_checkpoints_slash_its_name() -> None:
    open_ = TenantPolicy(name="t", allowed_gpu_types=frozenset(), max_gpus_per_job=8, max_runtime_s=3600, checkpoint_prefix=None)
    assert check_admission(job_spec(checkpoint_dir="/checkpoints/t/run-1"), open_, FLEET) == []
    for elsewhere in ("/ckpt/alpha/train-1", "/checkpoints/tx", "/checkpoints", "/"):
        problems = check_admission(job_spec(checkpoint_dir=elsewhere), open_, FLEET)
        assert [(p.field, p.reason) for p in problems] == [("checkpoint_dir", "must lie under the tenant's prefix /checkpoints/t")]


def test_a_cluster_whose_checkpoint_prefixes_nest_is_refused() -> None:
    def cluster(*prefixes: str | None) -> ClusterConfig:
        tenants = [{"name": f"t{i}", "checkpoint_prefix": p} for i, p in enumerate(prefixes)]
        return ClusterConfig.model_validate({"tenants": tenants})

    assert len(cluster("/ckpt/a", "/ckpt/b", None).tenants) == 3
    for nested in (("/ckpt", "/ckpt/b"), ("/ckpt/a", "/ckpt/a/"), ("/", None), ("/checkpoints/t1", None)):
        with pytest.raises(ValueError, match="checkpoint prefix"):
            cluster(*nested)


def test_admission_accepts_a_fitting_job() -> None:
    assert check_admission(job_spec(gpu_count=16, topology={"level": "leaf"}), ALPHA, FLEET) == []


@given(st.integers(min_value=1, max_value=64))
def test_gang_shape_rule(count: int) -> None:
    shapes = {8: 2}
    assert gang_fits_shape(count, shapes) == (count <= 8 or count == 16)


@given(st.integers(min_value=1, max_value=10**6))
def test_durations_round_trip(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_job_cap_refuses_at_the_cap_and_not_below() -> None:
    assert job_cap_problem("alpha", 1, 2) is None
    assert job_cap_problem("alpha", 5, None) is None
    problem = job_cap_problem("alpha", 2, 2)
    assert problem is not None
    assert (problem.field, problem.reason) == ("tenant", "tenant 'alpha' already has 2 unfinished jobs (limit 2)")


def test_sweep_admission_judges_every_trial_and_reports_each_problem_once() -> None:
    doc: dict[str, Any] = {
        "name": "lr",
        "parameters": {"grid": {"lr": [1, 2, 3]}},
        "template": {
            "entrypoint": ["python3", "train.py", "--lr={{lr}}"],
            "gpu_type": "H100-80GB",
            "gpu_count": 1,
            "max_runtime": "10m",
            "checkpoint_dir": "/ckpt/{{lr}}",
        },
    }
    problems = check_sweep_admission(
        parse_sweep({**doc, "template": {**doc["template"], "checkpoint_dir": "/ckpt/alpha/{{lr}}"}}), ALPHA, FLEET
    )
    assert problems == []
    problems = check_sweep_admission(parse_sweep(doc), ALPHA, FLEET)
    assert [(p.field, p.reason) for p in problems] == [("checkpoint_dir", "must lie under the tenant's prefix /ckpt/alpha")]
