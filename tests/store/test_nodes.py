"""Nodes on both backends: boots, heartbeats and lost nodes (the heartbeat's statements: test_heartbeat_path.py)."""

from __future__ import annotations

from fairgang.members import PlacedMember
from store import nodes, placement
from store.db import Database
from tests.store.helpers import queued_job


async def test_heartbeat_from_old_boot_is_refused(seeded: Database) -> None:
    await nodes.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="boot-1", gpus=[])
    assert (await nodes.node_heartbeat(seeded, node_id="h1", boot_id="boot-1"))[0]
    await nodes.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="boot-2", gpus=[])
    assert not (await nodes.node_heartbeat(seeded, node_id="h1", boot_id="boot-1"))[0]
    assert (await nodes.node_heartbeat(seeded, node_id="h1", boot_id="boot-2"))[0]


async def test_silent_nodes_are_declared_lost_with_their_jobs(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    await nodes.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b1", gpus=[], now=100.0)
    await nodes.register_node(seeded, node_id="h2", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b2", gpus=[], now=100.0)
    await nodes.node_heartbeat(seeded, node_id="h2", boot_id="b2", now=125.0)
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=1000, now=100.0)
    assert epoch is not None
    await placement.commit_bindings(
        seeded,
        bindings=[placement.BindingRow(job_id=job.id, attempt=1, members=[PlacedMember(node_id="h1", gpu_indices=[0], rank=0)])],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
        now=101.0,
    )
    lost = await nodes.mark_lost_nodes(seeded, lost_after_s=20, now=130.0)
    assert lost == {"h1": [job.id]}
    assert await nodes.mark_lost_nodes(seeded, lost_after_s=20, now=131.0) == {}
    states = {n.id: n.state for n in await nodes.list_nodes(seeded)}
    assert states["h1"] == "LOST" and states["h2"] == "READY"


async def test_a_lost_node_gets_no_allocation_back_and_its_late_heartbeat_is_refused(seeded: Database) -> None:
    job = await queued_job(seeded, "a")
    await nodes.register_node(seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b1", gpus=[], now=100.0)
    epoch = await placement.acquire_lease(seeded, name="placement", holder="me", ttl_s=1000, now=100.0)
    assert epoch is not None
    [alloc] = await placement.commit_bindings(
        seeded,
        bindings=[placement.BindingRow(job_id=job.id, attempt=1, members=[PlacedMember(node_id="h1", gpu_indices=[0], rank=0)])],
        pending_reasons={},
        lease_name="placement",
        epoch=epoch,
        now=101.0,
    )
    # While the node is fine, a re-registration (agent restart) gets its live allocation back.
    _, live = await nodes.register_node(
        seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b2", gpus=[], now=102.0
    )
    assert live == [alloc.id]
    await nodes.mark_lost_nodes(seeded, lost_after_s=20, now=200.0)
    accepted, live = await nodes.node_heartbeat(seeded, node_id="h1", boot_id="b2", now=201.0)
    assert not accepted and live == []
    node, live = await nodes.register_node(
        seeded, node_id="h1", gpu_type="H100-80GB", gpu_count=8, labels={}, boot_id="b2", gpus=[], now=202.0
    )
    assert node.state == "READY" and live == []
