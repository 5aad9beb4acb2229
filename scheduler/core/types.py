"""Frozen dataclasses at the boundary of the scheduling core."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeView:
    """A node as the scheduler sees it at snapshot time."""

    id: str
    gpu_type: str
    gpu_count: int
    #: Topology domain per level, e.g. (("leaf", "l1"), ("spine", "s1")).
    labels: tuple[tuple[str, str], ...]
    #: Indices of GPUs that are healthy and held by no live allocation.
    free: frozenset[int]
    #: False when the node is cordoned, lost or silent: it gets no new work.
    schedulable: bool = True

    def domain(self, level: str) -> str | None:
        """The node's domain at ``level`` (its own id at level ``node``)."""
        if level == "node":
            return self.id
        for name, value in self.labels:
            if name == level:
                return value
        return None


@dataclass(frozen=True)
class PendingJob:
    """A queued job waiting for GPUs."""

    id: str
    tenant: str
    attempt: int
    gpu_type: str
    gpu_count: int
    priority: int
    queued_at: float
    #: Topology level the gang must (or should) stay within; "any" for none.
    topology_level: str = "any"
    topology_required: bool = True


@dataclass(frozen=True)
class Snapshot:
    """Everything one cycle decides on; the core never looks anywhere else."""

    nodes: tuple[NodeView, ...]
    pending: tuple[PendingJob, ...]
    topology_levels: tuple[str, ...] = ("node", "leaf", "spine")


@dataclass(frozen=True)
class Member:
    """One node's share of a gang: which GPUs, and the member's rank."""

    node_id: str
    gpu_indices: tuple[int, ...]
    rank: int


@dataclass(frozen=True)
class Bind:
    """Bind a job's attempt to concrete GPUs (the whole gang)."""

    job_id: str
    attempt: int
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Decisions:
    """What a cycle decided: bindings in commit order, and why the others wait."""

    binds: tuple[Bind, ...] = ()
    pending_reasons: dict[str, str] = field(default_factory=dict)
