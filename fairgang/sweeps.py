"""The sweep contract (SPEC R9.3): a job template and the parameters of its trials.

A sweep expands into trials, each an ordinary job spec: the template with every
``{{name}}`` placeholder in its entrypoint, env values and labels replaced by the trial's
parameter values. Expansion is pure and deterministic (random search is seeded), so the
API, the sweep workflow's activities and any later reader agree on trial ``i``.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fairgang.durations import parse_duration
from fairgang.spec import (
    RESERVED_LABEL_PREFIX,
    JobSpec,
    SpecError,
    SpecProblem,
    load_document,
    parse_spec,
    problems_from_validation,
    reserved_env,
)

#: More trials than this in one sweep is almost surely a mistake (and a lot of jobs).
MAX_TRIALS = 10_000
#: ``{{ name }}`` in a template string.
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SWEEP_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,57}[a-z0-9])?$")
#: Fields of the template the sweep sets for each trial.
SET_BY_SWEEP = ("name", "tenant", "idempotency_key")
#: A job reports a metric with a line ``FAIRGANG_METRIC name=value [name=value ...]`` on stdout.
METRIC_LINE = re.compile(r"^FAIRGANG_METRIC\s+(.*)$")
_METRIC_PAIR = re.compile(r"^([A-Za-z0-9_.\-/]+)=(\S+)$")

ParamValue = bool | int | float | str


class RandomDistribution(BaseModel):
    """One parameter of a random search: exactly one of the four kinds."""

    model_config = ConfigDict(extra="forbid")

    uniform: tuple[float, float] | None = None
    log_uniform: tuple[float, float] | None = None
    integer: tuple[int, int] | None = Field(default=None, description="Inclusive bounds.")
    choice: list[ParamValue] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_kind(self) -> RandomDistribution:
        kinds = [k for k in ("uniform", "log_uniform", "integer", "choice") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("give exactly one of uniform, log_uniform, integer, choice")
        bounds = self.uniform or self.log_uniform or self.integer
        if bounds is not None and bounds[0] > bounds[1]:
            raise ValueError(f"{kinds[0]}: the low bound is above the high bound")
        if self.log_uniform is not None and self.log_uniform[0] <= 0:
            raise ValueError("log_uniform: bounds must be positive")
        return self

    def sample(self, rng: random.Random) -> ParamValue:
        if self.uniform is not None:
            return rng.uniform(*self.uniform)
        if self.log_uniform is not None:
            low, high = self.log_uniform
            return math.exp(rng.uniform(math.log(low), math.log(high)))
        if self.integer is not None:
            return rng.randint(*self.integer)
        assert self.choice is not None
        return rng.choice(self.choice)


class RandomSearch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int
    samples: int = Field(ge=1, le=MAX_TRIALS)
    space: dict[str, RandomDistribution] = Field(min_length=1)


class SweepParameters(BaseModel):
    """Exactly one of: a grid (cartesian product, first key slowest), an explicit list, a seeded random search."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    grid: dict[str, list[ParamValue]] | None = Field(default=None, min_length=1)
    trials: list[dict[str, ParamValue]] | None = Field(default=None, alias="list", min_length=1, max_length=MAX_TRIALS)
    random: RandomSearch | None = None

    @field_validator("grid")
    @classmethod
    def _grid(cls, value: dict[str, list[ParamValue]] | None) -> dict[str, list[ParamValue]] | None:
        for name, values in (value or {}).items():
            if not values:
                raise ValueError(f"'{name}' has no values")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> SweepParameters:
        kinds = [k for k in ("grid", "trials", "random") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("give exactly one of grid, list, random")
        if self.trials is not None:
            first = set(self.trials[0])
            for i, trial in enumerate(self.trials):
                if set(trial) != first:
                    raise ValueError(f"trial {i} names parameters {sorted(trial)}, trial 0 names {sorted(first)}")
        for name in self.names():
            if not _PARAM_NAME.match(name):
                raise ValueError(f"parameter name '{name}' must be letters, digits and '_', not starting with a digit")
        if self.grid is not None and math.prod(len(v) for v in self.grid.values()) > MAX_TRIALS:
            raise ValueError(f"the grid has {math.prod(len(v) for v in self.grid.values())} trials (at most {MAX_TRIALS})")
        return self

    def names(self) -> list[str]:
        if self.grid is not None:
            return list(self.grid)
        if self.trials is not None:
            return list(self.trials[0])
        assert self.random is not None
        return sorted(self.random.space)

    @property
    def field_name(self) -> str:
        return "grid" if self.grid is not None else "list" if self.trials is not None else "random.space"

    def expand(self) -> list[dict[str, ParamValue]]:
        """Every trial's parameters, in trial order."""
        if self.grid is not None:
            keys = list(self.grid)
            return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(self.grid[k] for k in keys))]
        if self.trials is not None:
            return [dict(t) for t in self.trials]
        assert self.random is not None
        rng = random.Random(self.random.seed)
        names = sorted(self.random.space)
        return [{n: self.random.space[n].sample(rng) for n in names} for _ in range(self.random.samples)]


class MetricSpec(BaseModel):
    """The metric that picks the best trial, as the jobs report it (``FAIRGANG_METRIC name=value``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-/]+$", max_length=64)
    goal: Literal["minimize", "maximize"] = "minimize"


class SweepSpec(BaseModel):
    """A sweep: trials of one job template. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field(description="Sweep name; trial i is the job '<name>-<i>'.")
    tenant: str | None = Field(default=None, description="Team; defaults to the caller's tenant.")
    template: dict[str, Any] = Field(description="A job spec without name, tenant and idempotency_key; {{param}} placeholders.")
    parameters: SweepParameters
    max_concurrent: int = Field(default=4, ge=1, le=1000, description="Trials running (unfinished) at once.")
    metric: MetricSpec | None = None
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SWEEP_NAME.match(value):
            raise ValueError("must be 1-59 lower-case letters, digits, '.', '_' or '-', starting and ending alphanumeric")
        return value

    def trial_params(self) -> list[dict[str, ParamValue]]:
        return self.parameters.expand()

    def trial_spec(self, index: int, params: dict[str, ParamValue], *, sweep_id: str = "", tenant: str | None = None) -> JobSpec:
        """The job spec of trial ``index``.

        Raises:
            SpecError: naming ``template.<field>`` for each problem.
        """
        return parse_spec_prefixed(render_template(self.template, params, index=index, sweep_id=sweep_id, name=self.name, tenant=tenant))


def trial_job_id(sweep_id: str, index: int) -> str:
    """Trial ``index`` of a sweep is the job (and job workflow) with this id, always."""
    return f"{sweep_id}-{index:04d}"


def _format(value: ParamValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _render(text: str, params: dict[str, ParamValue]) -> str:
    return PLACEHOLDER.sub(lambda m: _format(params[m.group(1)]), text)


def render_template(
    template: dict[str, Any], params: dict[str, ParamValue], *, index: int, sweep_id: str, name: str, tenant: str | None
) -> dict[str, Any]:
    """The trial's job document: placeholders filled, its own name, key and checkpoint dir."""
    doc = json.loads(json.dumps(template))
    if isinstance(doc.get("entrypoint"), list):
        doc["entrypoint"] = [_render(a, params) if isinstance(a, str) else a for a in doc["entrypoint"]]
    for key in ("env", "labels"):
        if isinstance(doc.get(key), dict):
            doc[key] = {k: _render(v, params) if isinstance(v, str) else v for k, v in doc[key].items()}
    env = doc.setdefault("env", {})
    if isinstance(env, dict):
        env.update({"FAIRGANG_SWEEP_ID": sweep_id, "FAIRGANG_TRIAL": str(index)})
    labels = doc.setdefault("labels", {})
    if isinstance(labels, dict):
        labels.update({"fairgang.sweep": sweep_id, "fairgang.trial": str(index)})
    # Trials must not share checkpoints: each gets a directory of its own under the template's.
    if isinstance(doc.get("checkpoint_dir"), str):
        doc["checkpoint_dir"] = doc["checkpoint_dir"].rstrip("/") + f"/trial-{index:04d}"
    doc["name"] = f"{name}-{index:04d}"
    doc["idempotency_key"] = f"sweep:{sweep_id}:{index}"
    if tenant is not None:
        doc["tenant"] = tenant
    return doc


def parse_spec_prefixed(doc: dict[str, Any]) -> JobSpec:
    try:
        return parse_spec(doc, platform=True)
    except SpecError as err:
        raise SpecError([SpecProblem(field=f"template.{p.field}", reason=p.reason) for p in err.problems]) from None


def _placeholder_problems(spec: SweepSpec) -> list[SpecProblem]:
    """Placeholders that name no parameter, and parameters no placeholder uses."""
    problems: list[SpecProblem] = []
    names = spec.parameters.names()
    used: set[str] = set()
    places: list[tuple[str, str]] = []
    if isinstance(spec.template.get("entrypoint"), list):
        places += [(f"template.entrypoint.{i}", a) for i, a in enumerate(spec.template["entrypoint"]) if isinstance(a, str)]
    for key in ("env", "labels"):
        if isinstance(spec.template.get(key), dict):
            places += [(f"template.{key}.{k}", v) for k, v in spec.template[key].items() if isinstance(v, str)]
    for where, text in places:
        for ref in PLACEHOLDER.findall(text):
            used.add(ref)
            if ref not in names:
                problems.append(SpecProblem(field=where, reason=f"unknown parameter '{ref}' (parameters: {', '.join(names)})"))
    for name in names:
        if name not in used:
            problems.append(
                SpecProblem(
                    field=f"parameters.{spec.parameters.field_name}.{name}",
                    reason="not used: put {{" + name + "}} in template.entrypoint, template.env or template.labels",
                )
            )
    return problems


def _reserved_problems(spec: SweepSpec) -> list[SpecProblem]:
    """The template's own env and labels may not use the platform's names (its trials get some of them)."""
    problems = []
    env, labels = spec.template.get("env"), spec.template.get("labels")
    for key in env if isinstance(env, dict) else ():
        if isinstance(key, str) and reserved_env(key):
            reason = f"'{key}' is reserved: it is set by the platform and cannot be set by a spec"
            problems.append(SpecProblem(field=f"template.env.{key}", reason=reason))
    for key in labels if isinstance(labels, dict) else ():
        if isinstance(key, str) and key.startswith(RESERVED_LABEL_PREFIX):
            problems.append(
                SpecProblem(field=f"template.labels.{key}", reason=f"labels under '{RESERVED_LABEL_PREFIX}' are the platform's")
            )
    return problems


def parse_sweep(data: Any) -> SweepSpec:
    """Validate a decoded document as a sweep spec, including every trial's job spec.

    Raises:
        SpecError: naming each bad field (``template.<field>`` for the trials' job specs).
    """
    if not isinstance(data, dict):
        raise SpecError([SpecProblem(field="(spec)", reason="must be a mapping of fields")])
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(problems_from_validation(err)) from None
    problems = [
        SpecProblem(field=f"template.{key}", reason="set by the sweep for each trial; leave it out")
        for key in SET_BY_SWEEP
        if key in spec.template
    ]
    problems += _placeholder_problems(spec)
    problems += _reserved_problems(spec)
    if problems:
        raise SpecError(problems)
    seen: set[tuple[str, str]] = set()
    for index, params in enumerate(spec.trial_params()):
        try:
            spec.trial_spec(index, params, sweep_id="sw-000000000000")
        except SpecError as err:
            for p in err.problems:
                if (p.field, p.reason) not in seen:
                    seen.add((p.field, p.reason))
                    problems.append(p)
        if len(problems) >= 20:
            break
    if problems:
        raise SpecError(problems)
    return spec


def load_sweep_text(text: str) -> SweepSpec:
    """Read a sweep spec from YAML or JSON text."""
    return parse_sweep(load_document(text))


def parse_metrics(text: str) -> dict[str, float]:
    """The metrics a job's log reports: the last ``FAIRGANG_METRIC name=value`` of each name wins."""
    metrics: dict[str, float] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line.strip())
        if match is None:
            continue
        for pair in match.group(1).split():
            kv = _METRIC_PAIR.match(pair)
            if kv is None:
                continue
            try:
                value = float(kv.group(2))
            except ValueError:
                continue
            if math.isfinite(value):
                metrics[kv.group(1)] = value
    return metrics


# ---------------------------------------------------------------- schedules

OVERLAP_POLICIES = ("skip", "buffer_one", "cancel_previous")


class ScheduleTiming(BaseModel):
    """When a scheduled sweep runs: a cron expression or an interval (exactly one)."""

    model_config = ConfigDict(extra="forbid")

    cron: str | None = Field(default=None, min_length=1, max_length=128, description="e.g. '0 2 * * *' (UTC unless timezone).")
    interval: float | None = Field(default=None, description="e.g. 30m, 1h, 1d (at least 1s).")
    offset: float | None = Field(default=None, description="Shifts interval runs, e.g. interval 1d offset 2h.")
    timezone: str | None = Field(default=None, max_length=64)

    @field_validator("interval", "offset", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else parse_duration(value)

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        if value is not None and len(value.split()) not in (5, 6, 7) and not value.startswith("@"):
            raise ValueError("a cron expression has 5 fields (minute hour day-of-month month day-of-week), or is @daily, @hourly, ...")
        return value

    @model_validator(mode="after")
    def _one(self) -> ScheduleTiming:
        if (self.cron is None) == (self.interval is None):
            raise ValueError("give exactly one of cron, interval")
        if self.interval is not None and self.interval < 1:
            raise ValueError("interval: at least 1s")
        return self


class ScheduleSpec(BaseModel):
    """A sweep run on a calendar, through a Temporal Schedule."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str
    tenant: str | None = None
    schedule: ScheduleTiming
    overlap: Literal["skip", "buffer_one", "cancel_previous"] = "skip"
    #: Runs missed while the service was down are made up within this window (default 1 minute).
    catchup_window: float = Field(default=60.0)
    paused: bool = False
    sweep: dict[str, Any] = Field(description="The sweep each run starts (its tenant is the schedule's).")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SWEEP_NAME.match(value):
            raise ValueError("must be 1-59 lower-case letters, digits, '.', '_' or '-', starting and ending alphanumeric")
        return value

    @field_validator("catchup_window", mode="before")
    @classmethod
    def _window(cls, value: Any) -> Any:
        return parse_duration(value)


def parse_schedule(data: Any) -> tuple[ScheduleSpec, SweepSpec]:
    """Validate a schedule document and the sweep inside it.

    Raises:
        SpecError: naming each bad field (``sweep.<field>`` for the sweep's).
    """
    if not isinstance(data, dict):
        raise SpecError([SpecProblem(field="(spec)", reason="must be a mapping of fields")])
    try:
        schedule = ScheduleSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(problems_from_validation(err)) from None
    try:
        sweep = parse_sweep(schedule.sweep)
    except SpecError as err:
        raise SpecError([SpecProblem(field=f"sweep.{p.field}", reason=p.reason) for p in err.problems]) from None
    return schedule, sweep


def load_schedule_text(text: str) -> tuple[ScheduleSpec, SweepSpec]:
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise SpecError([SpecProblem(field="(file)", reason=f"not valid YAML or JSON: {err}")]) from None
    return parse_schedule(data)
