"""The job contract (SPEC R1.1): what a team submits, as a pydantic model.

The model checks everything that can be checked without the fleet or the tenant's
policy (shape, types, ranges). Checks that need them (GPU type known, node shape,
tenant limits, checkpoint prefix) are admission's, in :mod:`fairgang.admission`.
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator

from fairgang.durations import parse_duration

#: Priority classes and their numeric weight; higher runs first within a tenant.
PRIORITY_CLASSES: dict[str, int] = {"low": 0, "normal": 100, "high": 200, "urgent": 300}

_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the platform sets for every job; a spec may not override them.
RESERVED_ENV = frozenset(
    {
        "FAIRGANG_JOB_ID",
        "FAIRGANG_ATTEMPT",
        "CHECKPOINT_DIR",
        "RESUME_FROM",
        "WORLD_SIZE",
        "RANK",
        "NODE_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
    }
)

Seconds = Annotated[float, BeforeValidator(parse_duration)]


class JobState(StrEnum):
    """Where a job is in its life. Terminal states never change again."""

    QUEUED = "QUEUED"
    PLACED = "PLACED"
    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})


class TopologySpec(BaseModel):
    """Where the gang's members must (or should) sit relative to each other.

    ``level`` names a topology level of the cluster config (``node``, ``leaf``,
    ``spine``, ...) or ``any``. ``required`` keeps the whole gang inside one domain of
    that level; ``preferred`` tries it first and falls back to wider ones.
    """

    model_config = ConfigDict(extra="forbid")

    level: str = Field(default="any", min_length=1, max_length=32)
    mode: Literal["required", "preferred"] = "required"


class JobSpec(BaseModel):
    """A job contract (SPEC R1.1). Unknown fields are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field(description="Job name: lower-case letters, digits, '.', '_' and '-'.")
    tenant: str | None = Field(default=None, description="Team; defaults to the caller's tenant.")
    image: str = Field(default="local", min_length=1, max_length=512, description="Container image.")
    entrypoint: list[str] = Field(min_length=1, description="argv of the job's process; never a shell string.")
    env: dict[str, str] = Field(default_factory=dict)
    gpu_type: str = Field(min_length=1, max_length=64)
    gpu_count: int = Field(ge=1, le=4096)
    max_runtime: Seconds = Field(description="Wall-clock limit, e.g. '2h'.")
    checkpoint_dir: str = Field(min_length=1, max_length=1024, description="Where the job writes checkpoints.")
    grace_period: Seconds = Field(default=30.0, description="Time between SIGTERM and SIGKILL.")
    priority_class: str = "normal"
    preemptible: bool = True
    topology: TopologySpec = Field(default_factory=TopologySpec)
    labels: dict[str, str] = Field(default_factory=dict)
    retries: int = Field(default=0, ge=0, le=20, description="Retries after the job's own failures.")
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=128)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be 1-64 lower-case letters, digits, '.', '_' or '-', starting and ending alphanumeric")
        return value

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: list[str]) -> list[str]:
        if not value[0].strip():
            raise ValueError("the program (first element) must not be empty")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not _ENV_KEY.match(key):
                raise ValueError(f"'{key}' is not a valid environment variable name")
            if key in RESERVED_ENV:
                raise ValueError(f"'{key}' is set by the platform and cannot be overridden")
        return value

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint_dir(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path")
        if ".." in value.split("/"):
            raise ValueError("must not contain '..'")
        return value.rstrip("/") or "/"

    @field_validator("priority_class")
    @classmethod
    def _priority_class(cls, value: str) -> str:
        if value not in PRIORITY_CLASSES:
            raise ValueError(f"unknown priority class '{value}' (one of {', '.join(PRIORITY_CLASSES)})")
        return value

    @field_validator("grace_period")
    @classmethod
    def _grace(cls, value: float) -> float:
        if value > 3600:
            raise ValueError("must be at most 1h")
        return value

    @property
    def priority(self) -> int:
        return PRIORITY_CLASSES[self.priority_class]


class SpecProblem(BaseModel):
    """One reason a spec was refused: the field (dotted path) and why."""

    field: str
    reason: str


class SpecError(Exception):
    """A spec was refused; ``problems`` names each field and reason."""

    def __init__(self, problems: list[SpecProblem]):
        self.problems = problems
        super().__init__("; ".join(f"{p.field}: {p.reason}" for p in problems))


def problems_from_validation(err: ValidationError, prefix: str = "") -> list[SpecProblem]:
    """Turn pydantic's errors into field/reason pairs."""
    out = []
    for item in err.errors():
        loc = ".".join(str(part) for part in item["loc"]) or "(spec)"
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown field"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        out.append(SpecProblem(field=f"{prefix}{loc}", reason=msg))
    return out


def parse_spec(data: Any) -> JobSpec:
    """Validate a decoded document as a job spec.

    Raises:
        SpecError: naming each bad field.
    """
    if not isinstance(data, dict):
        raise SpecError([SpecProblem(field="(spec)", reason="must be a mapping of fields")])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise SpecError(problems_from_validation(err)) from None


def load_document(text: str) -> Any:
    """Decode YAML or JSON text (JSON is YAML, but its errors read better).

    Raises:
        SpecError: when the text is neither.
    """
    try:
        return json.loads(text)
    except ValueError:
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise SpecError([SpecProblem(field="(file)", reason=f"not valid YAML or JSON: {err}")]) from None


def load_spec_text(text: str) -> JobSpec:
    """Read a job spec from YAML or JSON text."""
    return parse_spec(load_document(text))
