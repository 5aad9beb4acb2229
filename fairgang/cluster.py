"""The cluster config: tenants, quotas, tokens, nodes and their topology (YAML).

The same file drives ``fairgang dev`` (which seeds the store from it and starts one
simulated agent per node) and, later, the simulator. Topology levels are data.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from fairgang.admission import checkpoint_prefix
from fairgang.isolation import uid_collisions
from fairgang.spec import Seconds, SpecError, SpecProblem, problems_from_validation


class QuotaConfig(BaseModel):
    """A tenant's share of one GPU type (SPEC R4.1)."""

    model_config = ConfigDict(extra="forbid")

    nominal: int = Field(default=0, ge=0, description="Guaranteed GPUs.")
    borrow_limit: int | None = Field(default=None, ge=0, description="Most GPUs borrowed beyond nominal.")
    lend_limit: int | None = Field(default=None, ge=0, description="Most idle nominal GPUs lent to others.")


class TenantConfig(BaseModel):
    """A team: its weight, quotas and admission limits (SPEC R2.1, R4)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    weight: float = Field(default=1.0, gt=0)
    cohort: str | None = None
    tokens: list[str] = Field(default_factory=list, description="Its members' tokens.")
    admin_tokens: list[str] = Field(default_factory=list, description="Its admins' tokens: a member's rights and its tokens.")
    quotas: dict[str, QuotaConfig] = Field(default_factory=dict, description="Per GPU type; its keys are the allowed types.")
    max_gpus_per_job: int = Field(default=64, ge=1)
    max_runtime: Seconds = 48 * 3600.0
    max_concurrent_jobs: int = Field(default=100, ge=1)
    checkpoint_prefix: str | None = Field(default=None, description="Checkpoint paths must lie under it.")
    submissions_per_minute: float = Field(default=600.0, gt=0, description="Job submissions through the API: the bucket's refill.")
    submission_burst: int = Field(default=100, ge=1, description="Job submissions through the API: the bucket's size.")
    allowed_images: list[Annotated[str, Field(min_length=1, max_length=512)]] | None = Field(
        default=None, max_length=64, description="Glob patterns of the images its jobs may use ('local': the process runtime); none: any."
    )


class NodeConfig(BaseModel):
    """A GPU node: its GPUs and where it sits in the topology."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    gpu_type: str
    gpus: int = Field(ge=1, le=64)
    labels: dict[str, str] = Field(default_factory=dict, description="Topology domains, e.g. leaf: l1, spine: s1.")
    runtime: Literal["process", "podman", "docker"] = Field(default="process", description="How the agent runs members.")


class ClusterConfig(BaseModel):
    """The whole cluster config file."""

    model_config = ConfigDict(extra="forbid")

    topology_levels: list[str] = Field(default_factory=lambda: ["node", "leaf", "spine"])
    admin_tokens: list[str] = Field(default_factory=list)
    #: The secret each configured node's own credential is derived from (:func:`node_credential`); it
    #: authenticates nothing itself. Give each node's agent only its own credential.
    node_token: str = "fairgang-node-token"
    tenants: list[TenantConfig] = Field(default_factory=list)
    nodes: list[NodeConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> ClusterConfig:
        if not self.topology_levels or self.topology_levels[0] != "node":
            raise ValueError("topology_levels must start with 'node'")
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenant names must be unique")
        ids = [n.id for n in self.nodes]
        if len(set(ids)) != len(ids):
            raise ValueError("node ids must be unique")
        for node in self.nodes:
            for level in node.labels:
                if level not in self.topology_levels:
                    raise ValueError(f"node {node.id}: label '{level}' is not a topology level {self.topology_levels}")
        tokens = [tok for t in self.tenants for tok in [*t.tokens, *t.admin_tokens]] + self.admin_tokens + [self.node_token]
        if len(set(tokens)) != len(tokens):
            raise ValueError("tokens must be unique across tenants, admins and nodes")
        for problem in nested_prefixes(self.tenants):
            raise ValueError(problem)
        for a, b in uid_collisions(names):
            raise ValueError(f"tenants '{a}' and '{b}' would run their jobs as one uid (fairgang/isolation.py); rename one")
        return self


def nested_prefixes(tenants: list[TenantConfig]) -> list[str]:
    """Tenants whose checkpoint prefix lies within another's (each tenant's checkpoints must be its own)."""
    prefixes = {t.name: checkpoint_prefix(t.name, t.checkpoint_prefix).rstrip("/") + "/" for t in tenants}
    return [
        f"tenant '{b}': its checkpoint prefix {pb} lies within tenant '{a}''s {pa}"
        for a, pa in prefixes.items()
        for b, pb in prefixes.items()
        if a != b and pb.startswith(pa)
    ]


def tenant_change_problems(changed: TenantConfig, others: list[TenantConfig], gpu_types: set[str]) -> list[SpecProblem]:
    """What is wrong with a tenant's new policy beside the other tenants and the fleet's GPU types (a live change)."""
    problems = [
        SpecProblem(
            field=f"quotas.{gpu_type}", reason=f"unknown GPU type '{gpu_type}' (the fleet has {', '.join(sorted(gpu_types)) or 'none'})"
        )
        for gpu_type in sorted(set(changed.quotas) - gpu_types)
    ]
    problems += [SpecProblem(field="checkpoint_prefix", reason=p) for p in nested_prefixes([changed, *others]) if changed.name in p]
    return problems


def overcommitted(tenants: list[TenantConfig], capacity: dict[str, int]) -> list[str]:
    """Cohorts (a tenant without one stands alone) whose guaranteed GPUs of a type exceed the fleet's."""
    guaranteed: dict[tuple[str, str], int] = {}
    for t in tenants:
        for gpu_type, quota in t.quotas.items():
            key = (t.cohort or f"(tenant {t.name})", gpu_type)
            guaranteed[key] = guaranteed.get(key, 0) + quota.nominal
    return [
        f"cohort {cohort}: {total} {gpu_type} GPUs guaranteed, the fleet has {capacity.get(gpu_type, 0)}"
        for (cohort, gpu_type), total in sorted(guaranteed.items())
        if total > capacity.get(gpu_type, 0)
    ]


def load_cluster_config(path: str | Path) -> ClusterConfig:
    """Read and validate a cluster config file.

    Raises:
        SpecError: naming each bad field.
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise SpecError([SpecProblem(field="(file)", reason=str(err))]) from None
    try:
        return ClusterConfig.model_validate(data or {})
    except ValidationError as err:
        raise SpecError(problems_from_validation(err)) from None


def node_credential(node_token: str, node_id: str) -> str:
    """The credential of one configured node: HMAC-SHA256 of its id under the cluster's node secret.

    It lets that node's agent register and heartbeat as that node only; knowing it tells nothing of
    another node's credential or of the secret.
    """
    return "fgn-" + hmac.new(node_token.encode(), node_id.encode(), hashlib.sha256).hexdigest()
