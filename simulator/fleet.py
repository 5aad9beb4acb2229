"""The simulated fleet: nodes with their GPU type, size and topology, and the tenants' shares.

A fleet comes either from a cluster config file (the same YAML as ``fairgang dev``) or from
:func:`spec_fleet`, the SPEC's default of 750 nodes and 5,000 GPUs under leaves and spines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fairgang.cluster import ClusterConfig, load_cluster_config
from scheduler.core.types import Quota


@dataclass(frozen=True, slots=True)
class SimNode:
    """One node: its GPUs and its topology domains per level (in level order)."""

    id: str
    gpu_type: str
    gpus: int
    labels: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class TenantSpec:
    """A tenant's weight, cohort and per-GPU-type quotas (sorted by type)."""

    name: str
    weight: float = 1.0
    cohort: str | None = None
    quotas: tuple[tuple[str, Quota], ...] = ()


@dataclass(frozen=True)
class Fleet:
    """Nodes, topology levels, and the tenants the cluster config names (may be empty)."""

    nodes: tuple[SimNode, ...]
    topology_levels: tuple[str, ...] = ("node", "leaf", "spine")
    tenants: tuple[TenantSpec, ...] = ()
    name: str = "fleet"

    def capacity(self) -> dict[str, int]:
        """GPUs per GPU type."""
        out: dict[str, int] = {}
        for node in self.nodes:
            out[node.gpu_type] = out.get(node.gpu_type, 0) + node.gpus
        return dict(sorted(out.items()))

    def node_size(self) -> dict[str, int]:
        """The largest node per GPU type (the biggest single-node gang)."""
        out: dict[str, int] = {}
        for node in self.nodes:
            out[node.gpu_type] = max(out.get(node.gpu_type, 0), node.gpus)
        return dict(sorted(out.items()))

    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


#: The SPEC default: (GPU type, GPUs per node, nodes). 750 nodes, 5,000 GPUs.
SPEC_MIX: tuple[tuple[str, int, int], ...] = (
    ("H100-80GB", 8, 250),
    ("A100-80GB", 8, 150),
    ("A100-40GB", 8, 100),
    ("L40S", 4, 250),
)


def spec_fleet(*, nodes_per_leaf: int = 16, leaves_per_spine: int = 8, mix: tuple[tuple[str, int, int], ...] = SPEC_MIX) -> Fleet:
    """The SPEC's default fleet: each GPU type on its own leaves (InfiniBand rails), leaves under spines.

    Args:
        nodes_per_leaf: nodes under one leaf switch (16 x 8 GPUs = 128 GPUs per leaf).
        leaves_per_spine: leaves under one spine.
        mix: (GPU type, GPUs per node, node count) per type.
    """
    nodes: list[SimNode] = []
    leaf_no = 0
    for gpu_type, per_node, count in mix:
        slug = gpu_type.lower()
        for i in range(count):
            if i % nodes_per_leaf == 0:
                leaf_no += 1
            leaf = f"leaf-{leaf_no:03d}"
            spine = f"spine-{(leaf_no - 1) // leaves_per_spine + 1:02d}"
            nodes.append(SimNode(id=f"{slug}-{i + 1:04d}", gpu_type=gpu_type, gpus=per_node, labels=(("leaf", leaf), ("spine", spine))))
    return Fleet(nodes=tuple(nodes), name=f"spec ({len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs)")


def fleet_from_config(config: ClusterConfig, *, name: str = "config") -> Fleet:
    """A fleet from a parsed cluster config (tenants keep their weights, cohorts and quotas)."""
    levels = tuple(config.topology_levels)
    nodes = tuple(
        SimNode(
            id=n.id,
            gpu_type=n.gpu_type,
            gpus=n.gpus,
            labels=tuple((level, n.labels[level]) for level in levels if level in n.labels),
        )
        for n in config.nodes
    )
    tenants = tuple(
        TenantSpec(
            name=t.name,
            weight=t.weight,
            cohort=t.cohort,
            quotas=tuple(
                (gpu_type, Quota(nominal=q.nominal, borrow_limit=q.borrow_limit, lend_limit=q.lend_limit))
                for gpu_type, q in sorted(t.quotas.items())
            ),
        )
        for t in config.tenants
    )
    return Fleet(nodes=nodes, topology_levels=levels, tenants=tenants, name=name)


def load_fleet(spec: str) -> Fleet:
    """``"spec"`` for the SPEC default, otherwise the path of a cluster config file."""
    if spec == "spec":
        return spec_fleet()
    return fleet_from_config(load_cluster_config(spec), name=Path(spec).name)
