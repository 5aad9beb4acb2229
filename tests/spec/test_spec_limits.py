"""Limits on what a spec carries to a process, a path or a log name: control characters, sizes, and the
platform's reserved names, each refused with its field named."""

from __future__ import annotations

from typing import Any

import pytest

from fairgang.spec import MAX_ARG_BYTES, MAX_ARGS, MAX_ENV_VALUE_BYTES, MAX_ENV_VARS, MAX_LABELS, SpecError, parse_spec
from fairgang.sweeps import parse_sweep
from tests.builders import spec_dict


def problems(doc: dict[str, Any], **kw: Any) -> dict[str, str]:
    with pytest.raises(SpecError) as err:
        parse_spec(doc, **kw)
    return {p.field: p.reason for p in err.value.problems}


@pytest.mark.parametrize(
    ("overrides", "field", "reason"),
    [
        ({"env": {"A": "x\x00y"}}, "env", "control character ('\\x00' at offset 1)"),
        ({"entrypoint": ["python3", "a\x00b"]}, "entrypoint", "argument 1 holds a control character"),
        ({"entrypoint": ["py\tthon3"]}, "entrypoint", "argument 0 holds a control character"),
        ({"checkpoint_dir": "/ckpt/alpha/x\x00"}, "checkpoint_dir", "control character"),
        ({"checkpoint_dir": "/ckpt/alpha/x\ny"}, "checkpoint_dir", "control character"),
        ({"image": "img\x00"}, "image", "control character"),
        ({"idempotency_key": "k\x1b[2J"}, "idempotency_key", "control character"),
        ({"labels": {"team": "a\x00"}}, "labels", "control character"),
        ({"labels": {"te\nam": "a"}}, "labels", "control character"),
        ({"env": {f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)}}, "env", f"at most {MAX_ENV_VARS}"),
        ({"env": {"BIG": "x" * (MAX_ENV_VALUE_BYTES + 1)}}, "env", f"at most {MAX_ENV_VALUE_BYTES}"),
        ({"env": {f"V{i}": "x" * 30000 for i in range(5)}}, "env", "the environment comes to"),
        ({"env": {"A" * 129: "x"}}, "env", "not a valid environment variable name"),
        ({"entrypoint": ["python3"] + ["a"] * MAX_ARGS}, "entrypoint", f"at most {MAX_ARGS}"),
        ({"entrypoint": ["python3", "a" * (MAX_ARG_BYTES + 1)]}, "entrypoint", f"at most {MAX_ARG_BYTES}"),
        ({"entrypoint": ["python3"] + ["a" * 30000] * 5}, "entrypoint", "the arguments come to"),
        ({"labels": {f"l{i}": "x" for i in range(MAX_LABELS + 1)}}, "labels", f"at most {MAX_LABELS}"),
        ({"labels": {"k": "v" * 257}}, "labels", "at most 256"),
        ({"labels": {"k" * 64: "v"}}, "labels", "a key is 1-63"),
        ({"env": {"FAIRGANG_SWEEP_ID": "sw-x"}}, "env", "'FAIRGANG_SWEEP_ID' is reserved"),
        ({"env": {"FAIRGANG_TRIAL": "1"}}, "env", "'FAIRGANG_TRIAL' is reserved"),
        ({"env": {"FAIRGANG_NODE_TOKEN": "x"}}, "env", "reserved"),
        ({"env": {"LD_PRELOAD": "/tmp/evil.so"}}, "env", "'LD_PRELOAD' is reserved"),
        ({"env": {"LD_LIBRARY_PATH": "/tmp"}}, "env", "reserved"),
        ({"env": {"NVIDIA_VISIBLE_DEVICES": "all"}}, "env", "reserved"),
        ({"env": {"LOCAL_RANK": "0"}}, "env", "reserved"),
        ({"env": {"TORCHELASTIC_RUN_ID": "x"}}, "env", "reserved"),
        ({"labels": {"fairgang.sweep": "sw-x"}}, "labels", "are the platform's"),
    ],
)
def test_a_spec_over_a_limit_or_a_reserved_name_is_refused_naming_the_field(overrides: dict[str, Any], field: str, reason: str) -> None:
    found = problems(spec_dict(**overrides))
    assert field in found and reason in found[field], found


def test_text_that_reaches_a_process_may_keep_tabs_and_newlines() -> None:
    spec = parse_spec(spec_dict(env={"CONFIG": '{\n\t"lr": 1\n}\r\n'}, entrypoint=["python3", "-c", "print(1)\n\tprint(2)"]))
    assert spec.env["CONFIG"].startswith("{\n\t")


def test_the_platform_may_set_its_own_names_on_specs_it_builds_but_never_the_per_attempt_ones() -> None:
    own = spec_dict(env={"FAIRGANG_SWEEP_ID": "sw-1", "FAIRGANG_TRIAL": "3"}, labels={"fairgang.trial": "3"})
    assert parse_spec(own, platform=True).env["FAIRGANG_TRIAL"] == "3"
    assert "env" in problems(spec_dict(env={"RANK": "0"}), platform=True)


def test_a_sweep_template_may_not_use_reserved_names_and_its_trials_still_get_theirs() -> None:
    template = {k: v for k, v in spec_dict().items() if k not in ("name",)}
    bad = template | {
        "entrypoint": ["python3", "--lr={{lr}}"],
        "env": {"FAIRGANG_TRIAL": "9", "LD_AUDIT": "x"},
        "labels": {"fairgang.sweep": "x"},
    }
    doc: dict[str, Any] = {"name": "s", "template": bad, "parameters": {"grid": {"lr": [1, 2]}}}
    with pytest.raises(SpecError) as err:
        parse_sweep(doc)
    fields = {p.field for p in err.value.problems}
    assert {"template.env.FAIRGANG_TRIAL", "template.env.LD_AUDIT", "template.labels.fairgang.sweep"} <= fields, fields
    doc["template"] = template | {"entrypoint": ["python3", "--lr={{lr}}"]}
    sweep = parse_sweep(doc)
    trial = sweep.trial_spec(1, sweep.trial_params()[1], sweep_id="sw-abc")
    assert trial.env["FAIRGANG_TRIAL"] == "1" and trial.labels["fairgang.sweep"] == "sw-abc"
