"""The pure core: first-fit placement, whole gangs, topology, determinism, purity."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import NodeView, Pending, PendingJob, Snapshot, run_cycle

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "scheduler" / "core"
#: What the core may not import (nor anything inside it): the rest of the project, I/O libraries, the clock and randomness.
FORBIDDEN = {
    *("cli", "fairgang", "api", "store", "workflows", "activities", "worker_agent", "simulator", "scheduler.service", "scheduler.snapshot"),
    "scheduler.runtimes",
    *("temporalio", "sqlmodel", "sqlalchemy", "alembic", "fastapi", "starlette", "httpx", "pynvml", "prometheus_client"),
    *("asyncpg", "aiosqlite", "asyncio", "time", "random", "uuid"),
}


def node(node_id: str, gpus: int = 8, free: set[int] | None = None, leaf: str = "l1", gpu_type: str = "H100", **kw: object) -> NodeView:
    free_set = set(range(gpus)) if free is None else free
    return NodeView(id=node_id, gpu_type=gpu_type, gpu_count=gpus, labels=(("leaf", leaf),), free=frozenset(free_set), **kw)  # type: ignore[arg-type]


def job(job_id: str, count: int, *, priority: int = 100, queued_at: float = 0.0, level: str = "any", gpu_type: str = "H100") -> PendingJob:
    return PendingJob(
        id=job_id, tenant="t", attempt=1, gpu_type=gpu_type, gpu_count=count, priority=priority, queued_at=queued_at, topology_level=level
    )


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, relative imports resolved (``from x import y`` counts as x and x.y)."""
    names = []
    for item in ast.walk(ast.parse(path.read_text())):
        if isinstance(item, ast.Import):
            names += [a.name for a in item.names]
        elif isinstance(item, ast.ImportFrom):
            package = ["scheduler", "core"]
            base = ".".join(package[: len(package) - item.level + 1]) if item.level else ""
            module = ".".join(part for part in (base, item.module or "") if part)
            names += [module, *(f"{module}.{a.name}" for a in item.names)]
    return names


def test_core_imports_nothing_forbidden() -> None:
    for path in CORE.glob("*.py"):
        for name in _imports(path):
            assert not any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN), f"{path.name} imports {name}"


def test_the_forbidden_list_is_the_pure_core_import_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "pure-core"]
    assert contract["source_modules"] == ["scheduler.core"]
    assert set(contract["forbidden_modules"]) == FORBIDDEN


def test_single_node_job_takes_lowest_free_gpus_on_first_node_with_room() -> None:
    snap = Snapshot(nodes=(node("a", free={5, 6}), node("b")), pending=(job("j", 3),))
    [bind] = run_cycle(snap, 0.0).binds
    assert [(m.node_id, m.gpu_indices) for m in bind.members] == [("b", (0, 1, 2))]


def test_gang_takes_whole_nodes_in_one_leaf_or_waits() -> None:
    nodes = (node("a", leaf="l1"), node("b", leaf="l2", free={1, 2, 3, 4, 5, 6, 7}), node("c", leaf="l2"))
    decisions = run_cycle(Snapshot(nodes=nodes, pending=(job("big", 16, level="leaf"),)), 0.0)
    assert decisions.binds == ()
    assert decisions.pending_codes["big"] == Pending.NO_FREE_DOMAIN
    assert decisions.pending_reasons["big"] == "no topology domain fits: not enough wholly free H100 nodes in one leaf for 16 GPUs"
    more = (*nodes, node("d", leaf="l1"))
    [bind] = run_cycle(Snapshot(nodes=more, pending=(job("big", 16, level="leaf"),)), 0.0).binds
    assert [(m.node_id, m.rank, len(m.gpu_indices)) for m in bind.members] == [("a", 0, 8), ("d", 1, 8)]


def test_unschedulable_nodes_and_other_gpu_types_are_never_used() -> None:
    snap = Snapshot(nodes=(node("a", schedulable=False), node("b", gpu_type="L40S")), pending=(job("j", 1),))
    decisions = run_cycle(snap, 0.0)
    assert decisions.binds == () and decisions.pending_codes["j"] == Pending.NO_SCHEDULABLE_NODE


def test_higher_priority_then_older_goes_first() -> None:
    snap = Snapshot(
        nodes=(node("a", gpus=4),),
        pending=(job("old", 4, queued_at=1), job("new-high", 4, priority=200, queued_at=5), job("older", 4, queued_at=0)),
    )
    decisions = run_cycle(snap, 0.0)
    assert [b.job_id for b in decisions.binds] == ["new-high"]
    assert set(decisions.pending_reasons) == {"old", "older"}


jobs_st = st.lists(st.tuples(st.integers(1, 16), st.integers(0, 300), st.integers(0, 50)), max_size=30)


@settings(max_examples=100, deadline=None)
@given(jobs_st, st.lists(st.frozensets(st.integers(0, 7)), min_size=1, max_size=6))
def test_cycle_never_overcommits_and_is_deterministic(specs: list[tuple[int, int, int]], frees: list[frozenset[int]]) -> None:
    nodes = tuple(node(f"n{i}", free=set(f), leaf=f"l{i % 2}") for i, f in enumerate(frees))
    pending = tuple(job(f"j{i}", c, priority=p, queued_at=q) for i, (c, p, q) in enumerate(specs))
    snap = Snapshot(nodes=nodes, pending=pending)
    first = run_cycle(snap, 0.0)
    assert first == run_cycle(Snapshot(nodes=tuple(reversed(nodes)), pending=tuple(reversed(pending))), 0.0)
    taken: set[tuple[str, int]] = set()
    free = {n.id: n.free for n in nodes}
    for bind in first.binds:
        want = next(p.gpu_count for p in pending if p.id == bind.job_id)
        assert sum(len(m.gpu_indices) for m in bind.members) == want
        for m in bind.members:
            for g in m.gpu_indices:
                assert g in free[m.node_id] and (m.node_id, g) not in taken
                taken.add((m.node_id, g))
    assert {b.job_id for b in first.binds} | set(first.pending_reasons) == {p.id for p in pending}
