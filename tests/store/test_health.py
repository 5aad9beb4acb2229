"""GPU health on both backends: stored reports, injected faults."""

from __future__ import annotations

from store import health, nodes
from store.db import Database


async def test_a_fault_injected_while_a_report_is_assessed_is_kept(seeded: Database) -> None:
    """The heartbeat path reads a GPU, assesses the agent's report, then writes it back: an admin's
    injection (or return) in between must survive that write, not be overwritten by the stale read."""
    await nodes.register_node(
        seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b1", gpus=[{"index": 0, "health": {"simulated": True}}]
    )
    [stale] = [g for g in await nodes.list_gpus(seeded) if g.node_id == "h1" and g.index == 0]
    assert "injected" not in stale.health
    assert await health.inject_gpu_fault(seeded, node_id="h1", index=0, fault={"kind": "thermal"}) == [{"kind": "thermal"}]
    await health.set_gpu_health(seeded, node_id="h1", index=0, health={**stale.health, "temperature_c": 40}, keep_injected=True)
    [now] = [g for g in await nodes.list_gpus(seeded) if g.node_id == "h1" and g.index == 0]
    assert now.health["injected"] == [{"kind": "thermal"}] and now.health["temperature_c"] == 40
    # And the other way round: a GPU returned (injections cleared) meanwhile does not get a stale fault back.
    await health.set_gpu_health(seeded, node_id="h1", index=0, healthy=True, health={"simulated": True})
    await health.set_gpu_health(seeded, node_id="h1", index=0, health=dict(now.health), keep_injected=True)
    [after] = [g for g in await nodes.list_gpus(seeded) if g.node_id == "h1" and g.index == 0]
    assert "injected" not in after.health
    assert await health.inject_gpu_fault(seeded, node_id="h9", index=0, fault={"kind": "thermal"}) is None


async def test_a_health_event_is_recorded_once_and_an_uncordon_ends_the_degradation(seeded: Database) -> None:
    assert await health.degraded_since(seeded, "h1") is None
    assert await health.add_health_event(seeded, node_id="h1", kind="ecc_correctable", key="ecc-1", severity="degraded", now=10.0)
    assert not await health.add_health_event(seeded, node_id="h1", kind="ecc_correctable", key="ecc-1", severity="degraded", now=11.0)
    assert await health.add_health_event(seeded, node_id="h2", kind="ecc_correctable", key="ecc-1", severity="degraded", now=12.0)
    assert await health.degraded_since(seeded, "h1") == 10.0
    await health.add_health_event(seeded, node_id="h1", kind="uncordon", key="uncordon-1", now=20.0)
    assert await health.degraded_since(seeded, "h1") is None and await health.degraded_since(seeded, "h2") == 12.0
    assert await health.health_event_counts(seeded) == {"ecc_correctable": 2, "uncordon": 1}
    assert [e.ts for e in await health.recent_health_events(seeded, limit=2)] == [20.0, 12.0]
