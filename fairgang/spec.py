"""The job contract (SPEC R1.1): what a team submits, as a pydantic model.

The model checks everything that can be checked without the fleet or the tenant's
policy (shape, types, ranges). Checks that need them (GPU type known, node shape,
tenant limits, checkpoint prefix) are admission's, in :mod:`fairgang.admission`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fairgang.durations import parse_duration

#: Priority classes and their numeric weight; higher runs first within a tenant.
PRIORITY_CLASSES: dict[str, int] = {"low": 0, "normal": 100, "high": 200, "urgent": 300}

_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62}[a-z0-9])?$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Variables the platform sets for every job, or that steer the loader, the GPUs or the rendezvous; a
#: spec may not set them.
RESERVED_ENV = frozenset(
    {
        "FAIRGANG_JOB_ID",
        "FAIRGANG_ATTEMPT",
        "CHECKPOINT_DIR",
        "RESUME_FROM",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "NODE_RANK",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NNODES",
        "NPROC_PER_NODE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES",
    }
)
#: Prefixes of reserved variables (the platform's own, NVIDIA's container hooks, the dynamic loader's, torchrun's).
RESERVED_ENV_PREFIXES = ("FAIRGANG_", "NVIDIA_", "LD_", "TORCHELASTIC_")
#: Labels under this prefix are the platform's (a sweep's trials carry ``fairgang.sweep``, ``fairgang.trial``).
RESERVED_LABEL_PREFIX = "fairgang."
#: Caps on what a spec carries to a process, a path or a log name.
MAX_ENV_VARS = 256
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_ENV_BYTES = 128 * 1024
MAX_ARGS = 4096
MAX_ARG_BYTES = 32 * 1024
MAX_ARGV_BYTES = 128 * 1024
MAX_LABELS = 64
MAX_LABEL_KEY = 63
MAX_LABEL_VALUE = 256
#: Validation context of a spec the platform itself built (a sweep's trial) or stored: platform names allowed.
PLATFORM = {"platform": True}
#: Validation context of a spec read back from the store (:func:`stored_spec`): it met the limits of its day when
#: it was submitted, so the limits on what a submission may carry (reserved names, sizes, control characters)
#: are not applied again; a limit added since must not make a queued or running job unreadable.
STORED = {"platform": True, "stored": True}
#: C0 control characters and DEL; argv and env values may keep tab, newline and carriage return.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CONTROL_IN_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def reserved_env(key: str) -> bool:
    """Is this variable the platform's (a spec may not set it)?"""
    return key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES)


def _no_control(value: str, what: str, *, text: bool = False) -> str:
    """Refuse NUL and other control characters (``text``: tab, newline and CR allowed)."""
    found = (_CONTROL_IN_TEXT if text else _CONTROL).search(value)
    if found:
        raise ValueError(f"{what} holds a control character ({found.group()!r} at offset {found.start()})")
    return value


def _size(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


def _from_platform(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("platform"))


def _from_store(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("stored"))


Seconds = Annotated[float, BeforeValidator(parse_duration)]


class JobState(StrEnum):
    """Where a job is in its life. Terminal states never change again."""

    QUEUED = "QUEUED"
    #: Queued, but kept from placement by its owner or an admin until released (Slurm's hold).
    HELD = "HELD"
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


class GpuRange(BaseModel):
    """An elastic job's GPUs (SPEC R9.2): it starts at ``min`` (what it is entitled to) and may grow to ``max``.

    Its step is one GPU on one node, one whole node once it spans several (admission checks the shapes).
    """

    model_config = ConfigDict(extra="forbid")

    min: int = Field(ge=1, le=4096, description="GPUs it starts with and never runs below (unless preempted whole).")
    max: int = Field(ge=1, le=4096, description="Most GPUs it grows to onto idle capacity.")

    @model_validator(mode="after")
    def _ordered(self) -> GpuRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is more than max ({self.max})")
        return self


#: The tags of ``gpu_count``'s two forms; errors name the field without them (``gpu_count``, ``gpu_count.min``).
_GPU_COUNT_TAGS = ("fixed-count", "gpu-range")

#: A number of GPUs, or an elastic job's range: told apart by their shape, so an error is the one form's only.
GpuCount = Annotated[
    Annotated[int, Field(ge=1, le=4096), Tag(_GPU_COUNT_TAGS[0])] | Annotated[GpuRange, Tag(_GPU_COUNT_TAGS[1])],
    Discriminator(lambda v: _GPU_COUNT_TAGS[1] if isinstance(v, dict | GpuRange) else _GPU_COUNT_TAGS[0]),
]


class JobSpec(BaseModel):
    """A job contract (SPEC R1.1). Unknown fields are refused, not ignored."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field(description="Job name: lower-case letters, digits, '.', '_' and '-'.")
    tenant: str | None = Field(default=None, description="Team; defaults to the caller's tenant.")
    image: str = Field(default="local", min_length=1, max_length=512, description="Container image.")
    entrypoint: list[str] = Field(min_length=1, description="argv of the job's process; never a shell string.")
    env: dict[str, str] = Field(default_factory=dict)
    gpu_type: str = Field(min_length=1, max_length=64)
    gpu_count: GpuCount = Field(
        description="GPUs of the gang: a number (a fixed job), or {min, max} (an elastic job that starts at min and grows)."
    )
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

    @field_validator("tenant", "image", "idempotency_key")
    @classmethod
    def _plain(cls, value: str | None, info: ValidationInfo) -> str | None:
        return value if value is None or _from_store(info) else _no_control(value, "the value")

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if _from_store(info):
            return value
        if not value[0].strip():
            raise ValueError("the program (first element) must not be empty")
        if len(value) > MAX_ARGS:
            raise ValueError(f"{len(value)} arguments: at most {MAX_ARGS}")
        for i, arg in enumerate(value):
            _no_control(arg, f"argument {i}", text=i > 0)
            if _size(arg) > MAX_ARG_BYTES:
                raise ValueError(f"argument {i} is {_size(arg)} bytes: at most {MAX_ARG_BYTES}")
        if sum(map(_size, value)) > MAX_ARGV_BYTES:
            raise ValueError(f"the arguments come to {sum(map(_size, value))} bytes: at most {MAX_ARGV_BYTES}")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if _from_store(info):
            return value
        if len(value) > MAX_ENV_VARS:
            raise ValueError(f"{len(value)} variables: at most {MAX_ENV_VARS}")
        for key, item in value.items():
            if not _ENV_KEY.match(key) or len(key) > 128:
                raise ValueError(f"{key[:64]!r} is not a valid environment variable name (letters, digits, '_'; at most 128)")
            if key in RESERVED_ENV or (reserved_env(key) and not _from_platform(info)):
                raise ValueError(f"'{key}' is reserved: it is set by the platform and cannot be set by a spec")
            _no_control(item, f"the value of {key}", text=True)
            if _size(item) > MAX_ENV_VALUE_BYTES:
                raise ValueError(f"the value of {key} is {_size(item)} bytes: at most {MAX_ENV_VALUE_BYTES}")
        total = sum(_size(k) + _size(v) for k, v in value.items())
        if total > MAX_ENV_BYTES:
            raise ValueError(f"the environment comes to {total} bytes: at most {MAX_ENV_BYTES}")
        return value

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if _from_store(info):
            return value
        if len(value) > MAX_LABELS:
            raise ValueError(f"{len(value)} labels: at most {MAX_LABELS}")
        for key, item in value.items():
            if not key or len(key) > MAX_LABEL_KEY:
                raise ValueError(f"label {key[:64]!r}: a key is 1-{MAX_LABEL_KEY} characters")
            _no_control(key, f"label {key[:64]!r}")
            _no_control(item, f"the value of label {key}")
            if len(item) > MAX_LABEL_VALUE:
                raise ValueError(f"the value of label {key} is {len(item)} characters: at most {MAX_LABEL_VALUE}")
            if key.startswith(RESERVED_LABEL_PREFIX) and not _from_platform(info):
                raise ValueError(f"label '{key}': labels under '{RESERVED_LABEL_PREFIX}' are the platform's")
        return value

    @field_validator("checkpoint_dir")
    @classmethod
    def _checkpoint_dir(cls, value: str, info: ValidationInfo) -> str:
        if _from_store(info):
            return value
        _no_control(value, "the path")
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

    @property
    def min_gpus(self) -> int:
        """What the job starts with and is entitled to: its fixed count, or its range's minimum."""
        return self.gpu_count if isinstance(self.gpu_count, int) else self.gpu_count.min

    @property
    def max_gpus(self) -> int:
        """The most it ever holds: its fixed count, or its range's maximum."""
        return self.gpu_count if isinstance(self.gpu_count, int) else self.gpu_count.max

    @property
    def elastic(self) -> bool:
        return self.max_gpus > self.min_gpus

    def stored(self, tenant: str) -> dict[str, Any]:
        """The spec as the store keeps it (``job.spec``): JSON values, the tenant filled in, no idempotency key (the
        job row has its own). :func:`stored_spec` reads it back into an equal model, but for the key."""
        return self.model_dump(mode="json", exclude={"idempotency_key"}) | {"tenant": tenant}


def stored_spec(spec: Mapping[str, Any]) -> JobSpec:
    """A job's spec as stored (``job.spec``, see :meth:`JobSpec.stored`), as the model.

    Rows written by earlier versions lack the fields added since: the model's defaults fill them in. The
    submission limits are not checked again (see ``STORED``).
    """
    return JobSpec.model_validate(spec, context=STORED)


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
        loc = ".".join(str(part) for part in item["loc"] if part not in _GPU_COUNT_TAGS) or "(spec)"
        msg = item["msg"]
        if item["type"] == "extra_forbidden":
            msg = "unknown field"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        out.append(SpecProblem(field=f"{prefix}{loc}", reason=msg))
    return out


def parse_spec(data: Any, *, platform: bool = False) -> JobSpec:
    """Validate a decoded document as a job spec (``platform``: one the platform built, see PLATFORM).

    Raises:
        SpecError: naming each bad field.
    """
    if not isinstance(data, dict):
        raise SpecError([SpecProblem(field="(spec)", reason="must be a mapping of fields")])
    try:
        return JobSpec.model_validate(data, context=PLATFORM if platform else None)
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
