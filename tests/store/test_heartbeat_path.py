"""The heartbeat's path through the store: its own node's rows only, few statements, indexed queries.

The query plans are read from the database itself (``EXPLAIN QUERY PLAN`` on SQLite, ``EXPLAIN`` on
PostgreSQL with sequential scans disabled), for the statements the store functions really send, so a
query rewritten so that its index no longer applies is caught here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import event

from fairgang.members import PlacedMember
from store import health as stored_health
from store import jobs, nodes, placement
from store.db import Database
from tests.builders import job_spec

HEALTH = {"simulated": True, "utilization_pct": 0.0, "temperature_c": 35, "xid_errors": []}


class Statements:
    """Every statement the store sends while it is open, with its parameters."""

    def __init__(self, db: Database) -> None:
        self.engines = {db.engine.sync_engine, db.read_engine.sync_engine}
        self.sent: list[tuple[str, Any, bool]] = []

    def _record(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool) -> None:
        self.sent.append((statement, parameters, executemany))

    def __enter__(self) -> Statements:
        for engine in self.engines:
            event.listen(engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *_exc: object) -> None:
        for engine in self.engines:
            event.remove(engine, "before_cursor_execute", self._record)

    @property
    def queries(self) -> list[tuple[str, Any, bool]]:
        """Without the transaction control (BEGIN, COMMIT, ...)."""
        return [s for s in self.sent if s[0].split(None, 1)[0].upper() in ("SELECT", "UPDATE", "INSERT", "DELETE")]


async def _fleet_with_allocations(db: Database) -> str:
    """h1 and h2 registered, one live allocation on each and a released one on h1; returns h1's live allocation id."""
    for node in ("h1", "h2"):
        gpus = [{"index": i, "health": dict(HEALTH)} for i in range(8)]
        await nodes.register_node(db, node_id=node, gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id=f"boot-{node}", gpus=gpus)
    epoch = await placement.acquire_lease(db, name="placement", holder="me", ttl_s=60)
    assert epoch is not None
    live = ""
    for i, node in enumerate(("h1", "h1", "h2")):
        job, _ = await jobs.create_job(db, spec=job_spec(name=f"j{i}"), tenant="alpha")
        await jobs.mark_queued(db, job_id=job.id, attempt=1)
        [alloc] = await placement.commit_bindings(
            db,
            bindings=[placement.BindingRow(job_id=job.id, attempt=1, members=[PlacedMember(node_id=node, gpu_indices=[i], rank=0)])],
            pending_reasons={},
            lease_name="placement",
            epoch=epoch,
        )
        if i == 0:
            assert await placement.release_allocation(db, job_id=job.id, allocation_id=alloc.id)
        elif node == "h1":
            live = alloc.id
    return live


async def _plans(db: Database, statements: list[tuple[str, Any, bool]]) -> list[tuple[str, list[str]]]:
    """Each statement with its plan's lines."""
    out = []
    async with db.engine.connect() as conn:
        if not db.sqlite:
            await conn.exec_driver_sql("SET enable_seqscan = off")
        for statement, parameters, executemany in statements:
            params = parameters[0] if executemany else parameters
            prefix = "EXPLAIN QUERY PLAN " if db.sqlite else "EXPLAIN "
            rows = (await conn.exec_driver_sql(prefix + statement, params)).all()
            out.append((statement, [str(r[-1]) for r in rows]))
        await conn.rollback()
    return out


def _full_scans(plan: list[str], sqlite: bool) -> list[str]:
    """The plan's lines that read a whole table (or a whole index that is not the live-GPU one)."""
    if sqlite:
        return [line for line in plan if line.startswith("SCAN ") and "USING INDEX uq_allocation_gpu_live" not in line]
    return [line for line in plan if "Seq Scan" in line]


async def _statements_of(db: Database, call: Callable[[], Awaitable[object]]) -> list[tuple[str, Any, bool]]:
    with Statements(db) as seen:
        await call()
    return seen.queries


async def test_the_hot_allocation_queries_use_the_live_gpu_index(seeded: Database) -> None:
    await _fleet_with_allocations(seeded)
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "heartbeat (live allocations)": lambda: nodes.node_heartbeat(seeded, node_id="h1", boot_id="boot-h1"),
        "gpu_jobs": lambda: stored_health.gpu_jobs(seeded, "h1"),
        "node_jobs": lambda: nodes.node_jobs(seeded, "h1"),
        "live_allocation_gpus": lambda: placement.live_allocation_gpus(seeded),
        "mark_lost_nodes": lambda: nodes.mark_lost_nodes(seeded, lost_after_s=-1000),
    }
    for name, call in calls.items():
        statements = [s for s in await _statements_of(seeded, call) if "allocation_gpu" in s[0]]
        assert statements, f"{name} sent no query on allocation_gpu"
        for statement, plan in await _plans(seeded, statements):
            assert any("uq_allocation_gpu_live" in line for line in plan), f"{name}: {statement}\n" + "\n".join(plan)
            assert not _full_scans(plan, seeded.sqlite), f"{name}: {statement}\n" + "\n".join(plan)


async def test_a_heartbeat_reads_and_writes_only_its_own_node_in_one_transaction(seeded: Database) -> None:
    live = await _fleet_with_allocations(seeded)
    version = await placement.change_version(seeded)
    reports: dict[int, dict[str, Any]] = {i: {**HEALTH, "temperature_c": 40 + i} for i in range(8)}

    def policy(gpus: dict[int, nodes.GpuHealth]) -> dict[int, tuple[dict[str, Any], bool]]:
        assert sorted(gpus) == list(range(8))
        return {i: (health, False) for i, health in reports.items()}

    with Statements(seeded) as seen:
        beat = await nodes.record_heartbeat(seeded, node_id="h1", boot_id="boot-h1", policy=policy)
    assert beat.accepted and beat.live == [live] and beat.taken_out == []
    begins = [s for s, _, _ in seen.sent if s.split(None, 1)[0].upper() == "BEGIN"]
    assert len(begins) <= 1  # PostgreSQL's BEGIN is implicit in the driver
    writes = [(s, p, many) for s, p, many in seen.queries if s.startswith("UPDATE gpu")]
    assert len(writes) == 1 and writes[0][2] and len(writes[0][1]) == 8, "every GPU's health in one statement"
    for statement, parameters, many in seen.queries:
        params = parameters if many else [parameters]
        values = {str(v) for p in params for v in (p.values() if isinstance(p, dict) else p)}
        assert "h2" not in values, f"a heartbeat of h1 touched h2: {statement}"
    # The fast path: nothing changed for the placement service, nothing beyond the heartbeat and the health.
    assert len(seen.queries) == 4, [s for s, _, _ in seen.queries]
    for statement, plan in await _plans(seeded, seen.queries):
        assert not _full_scans(plan, seeded.sqlite), f"{statement}\n" + "\n".join(plan)
    assert await placement.change_version(seeded) == version
    stored = {g.index: g.health for g in await nodes.list_gpus(seeded) if g.node_id == "h1"}
    assert stored[3]["temperature_c"] == 43
    # Nothing written when nothing changed.
    with Statements(seeded) as seen:
        await nodes.record_heartbeat(seeded, node_id="h1", boot_id="boot-h1", policy=policy)
    assert not [s for s, _, _ in seen.queries if s.startswith("UPDATE gpu")]


async def test_a_heartbeat_taking_a_gpu_out_wakes_the_scheduler_and_names_its_jobs(seeded: Database) -> None:
    live = await _fleet_with_allocations(seeded)
    version = await placement.change_version(seeded)
    beat = await nodes.record_heartbeat(
        seeded, node_id="h1", boot_id="boot-h1", policy=lambda gpus: {1: ({**gpus[1].health, "xid_errors": [79]}, True)}
    )
    assert beat.taken_out == [1]
    assert [(i, a) for i, _, a in beat.gpu_jobs] == [(1, 1)]
    assert await placement.change_version(seeded) > version
    gpus = {g.index: g for g in await nodes.list_gpus(seeded) if g.node_id == "h1"}
    assert not gpus[1].healthy and gpus[0].healthy and gpus[1].health["xid_errors"] == [79]
    # Already out: a second fatal report takes nothing out again.
    again = await nodes.record_heartbeat(seeded, node_id="h1", boot_id="boot-h1", policy=lambda gpus: {1: (gpus[1].health, True)})
    assert again.taken_out == [] and again.live == [live]
    # Refused: an old boot, a node declared lost.
    assert not (await nodes.record_heartbeat(seeded, node_id="h1", boot_id="boot-old", policy=lambda g: {})).accepted
    await nodes.mark_lost_nodes(seeded, lost_after_s=-1000)
    refused = await nodes.record_heartbeat(seeded, node_id="h1", boot_id="boot-h1", policy=lambda g: {})
    assert not refused.accepted and refused.live == []


async def test_a_heartbeat_keeps_the_rows_own_injected_faults(seeded: Database) -> None:
    """The health written back carries the row's injected faults, never those of the report it was assessed from."""
    await _fleet_with_allocations(seeded)
    assert await stored_health.inject_gpu_fault(seeded, node_id="h1", index=0, fault={"kind": "thermal"}) == [{"kind": "thermal"}]
    seen: dict[int, nodes.GpuHealth] = {}

    def stale(gpus: dict[int, nodes.GpuHealth]) -> dict[int, tuple[dict[str, Any], bool]]:
        seen.update(gpus)
        return {0: ({**HEALTH, "temperature_c": 50}, False)}  # a report assessed without the injection

    await nodes.record_heartbeat(seeded, node_id="h1", boot_id="boot-h1", policy=stale)
    assert seen[0].health["injected"] == [{"kind": "thermal"}]
    [gpu] = [g for g in await nodes.list_gpus(seeded) if g.node_id == "h1" and g.index == 0]
    assert gpu.health["injected"] == [{"kind": "thermal"}] and gpu.health["temperature_c"] == 50
    # Returned meanwhile: a report that still carries the old fault does not bring it back.
    await stored_health.set_gpu_health(seeded, node_id="h1", index=0, healthy=True, health=dict(HEALTH))
    await nodes.record_heartbeat(seeded, node_id="h1", boot_id="boot-h1", policy=lambda g: {0: (dict(gpu.health), False)})
    [after] = [g for g in await nodes.list_gpus(seeded) if g.node_id == "h1" and g.index == 0]
    assert "injected" not in after.health
