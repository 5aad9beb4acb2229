"""The cluster config loaded into the store, and what admission reads of it, on both backends."""

from __future__ import annotations

from fairgang.admission import TenantPolicy
from store import nodes, tenants
from store.db import Database


async def test_seeding_twice_changes_nothing(seeded: Database) -> None:
    from tests.conftest import small_cluster

    await tenants.seed_cluster(seeded, small_cluster())
    assert len(await nodes.list_nodes(seeded)) == 3
    assert len(await nodes.list_gpus(seeded)) == 20


async def test_the_fleet_shape_for_admission_is_counted_per_node_shape(seeded: Database) -> None:
    shape = await tenants.fleet_shape(seeded)
    assert shape.shapes == {"H100-80GB": {8: 2}, "L40S": {4: 1}}
    assert shape.levels == {"node", "leaf", "spine"}
    await nodes.enrol_node(seeded, node_id="x1", gpu_type="L40S", gpu_count=2, labels={})
    await nodes.register_node(
        seeded, node_id="x1", gpu_type="L40S", gpu_count=2, labels={"rack": "r9"}, boot_id="b", gpus=[{"index": 0}, {"index": 1}]
    )
    shape = await tenants.fleet_shape(seeded)
    assert shape.shapes == {"H100-80GB": {8: 2}, "L40S": {4: 1, 2: 1}}
    assert shape.levels == {"node", "leaf", "spine", "rack"}


async def test_a_tenants_admission_policy_is_its_stored_limits(seeded: Database) -> None:
    alpha, beta = await tenants.list_tenants(seeded)
    assert tenants.tenant_policy(alpha) == TenantPolicy(
        name="alpha",
        allowed_gpu_types=frozenset({"H100-80GB", "L40S"}),
        max_gpus_per_job=16,
        max_runtime_s=24 * 3600,
        checkpoint_prefix="/ckpt/alpha",
    )
    assert tenants.tenant_policy(beta) == TenantPolicy(
        name="beta", allowed_gpu_types=frozenset({"H100-80GB"}), max_gpus_per_job=8, max_runtime_s=2 * 3600, checkpoint_prefix="/ckpt/beta"
    )
    assert await tenants.get_tenant(seeded, "gamma") is None
