"""A placed gang member: the one shape of an allocation's members in the store, the placement signal, the job
workflow and the launch input.

A plain dataclass (Temporal's default converter sends it as ``{"node_id", "gpu_indices", "rank"}``, the shape the
store's ``allocation.members`` JSON column holds), with no I/O imports, so the workflow sandbox passes it through.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class PlacedMember:
    """One member of an attempt's gang: the node it runs on, its GPUs there, its rank (one member per node)."""

    node_id: str
    gpu_indices: list[int]
    rank: int

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> PlacedMember:
        """A member as stored (an element of ``allocation.members``)."""
        return cls(node_id=stored["node_id"], gpu_indices=list(stored["gpu_indices"]), rank=stored["rank"])

    def stored(self) -> dict[str, Any]:
        """As the store keeps it (an element of ``allocation.members``)."""
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.node_id}[{','.join(map(str, self.gpu_indices))}]"


def members_of(stored: Iterable[Mapping[str, Any]]) -> list[PlacedMember]:
    """An allocation's members as stored."""
    return [PlacedMember.of(m) for m in stored]
