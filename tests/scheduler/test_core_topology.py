"""Topology: levels are data, required vs preferred, best fit, whole nodes in few domains, fragmentation."""

from __future__ import annotations

from scheduler.core import NodeView, Pending, SchedulerConfig, Snapshot, run_cycle
from tests.scheduler.test_core_builders import job, leaf_nodes, node, placed, running, snap


def test_a_single_node_job_goes_to_the_fullest_node_that_fits() -> None:
    nodes = [node("empty"), node("half", free={0, 1, 2, 3}), node("three", free={5, 6, 7}), node("one", free={7})]
    decisions = run_cycle(snap(nodes, [job("j", 3)]), 0.0)
    assert placed(decisions) == {"j": [("three", (5, 6, 7))]}


def test_small_jobs_fill_partly_used_nodes_so_a_whole_node_stays_free() -> None:
    nodes = [node("a", free={0, 1, 2, 3}), node("b")]
    decisions = run_cycle(snap(nodes, [job("s1", 2, queued_at=0), job("s2", 2, queued_at=1), job("big", 8, queued_at=2)]), 5.0)
    where = placed(decisions)
    assert where["s1"][0][0] == "a" and where["s2"][0][0] == "a" and where["big"] == [("b", tuple(range(8)))]


def test_a_gang_with_a_required_leaf_never_crosses_leaves() -> None:
    nodes = [*leaf_nodes("l1", 1), *leaf_nodes("l2", 1)]
    decisions = run_cycle(snap(nodes, [job("g", 16, level="leaf")]), 0.0)
    assert decisions.binds == ()
    assert decisions.pending_codes["g"] == Pending.DOMAIN_TOO_SMALL
    assert decisions.pending_reasons["g"] == "node shape can never fit: the largest leaf has 8 H100 GPUs, the job needs 16"


def test_a_gang_takes_whole_nodes_in_the_smallest_leaf_that_holds_it() -> None:
    nodes = [*leaf_nodes("big", 4), *leaf_nodes("small", 2), node("small-busy", leaf="small", free={1, 2, 3, 4, 5, 6, 7})]
    decisions = run_cycle(snap(nodes, [job("g", 16, level="leaf")]), 0.0)
    assert placed(decisions) == {"g": [("small-n0", tuple(range(8))), ("small-n1", tuple(range(8)))]}


def test_a_preferred_leaf_falls_back_to_the_fewest_leaves() -> None:
    nodes = [*leaf_nodes("a", 1), *leaf_nodes("b", 3), *leaf_nodes("c", 2)]
    decisions = run_cycle(snap(nodes, [job("g", 40, level="leaf", required=False)]), 0.0)
    leaves = [m[0].split("-")[0] for m in placed(decisions)["g"]]
    assert sorted(leaves) == ["b", "b", "b", "c", "c"]


def test_a_required_spine_gang_spans_leaves_of_one_spine_only() -> None:
    nodes = [*leaf_nodes("l1", 2, spine="s1"), *leaf_nodes("l2", 1, spine="s1"), *leaf_nodes("l3", 2, spine="s2")]
    decisions = run_cycle(snap(nodes, [job("g", 24, level="spine")]), 0.0)
    assert sorted(n for n, _ in placed(decisions)["g"]) == ["l1-n0", "l1-n1", "l2-n0"]


def test_a_gang_of_an_odd_size_takes_a_part_of_its_last_node() -> None:
    decisions = run_cycle(snap(leaf_nodes("l1", 3), [job("g", 12, level="leaf")]), 0.0)
    assert placed(decisions) == {"g": [("l1-n0", tuple(range(8))), ("l1-n1", (0, 1, 2, 3))]}


def test_topology_levels_are_data() -> None:
    def rack_node(node_id: str, rack: str, pod: str) -> NodeView:
        return NodeView(id=node_id, gpu_type="H100", gpu_count=8, labels=(("rack", rack), ("pod", pod)), free=frozenset(range(8)))

    nodes = (rack_node("a", "r1", "p1"), rack_node("b", "r2", "p1"), rack_node("c", "r3", "p2"))
    snapshot = Snapshot(nodes=nodes, pending=(job("g", 16, level="pod"),), topology_levels=("node", "rack", "pod"))
    decisions = run_cycle(snapshot, 0.0)
    assert [m.node_id for m in decisions.binds[0].members] == ["a", "b"]
    bad = run_cycle(Snapshot(nodes=nodes, pending=(job("g", 16, level="leaf"),), topology_levels=("node", "rack", "pod")), 0.0)
    assert bad.pending_codes["g"] == Pending.UNKNOWN_LEVEL
    assert bad.pending_reasons["g"] == "node shape can never fit: unknown topology level 'leaf' (levels: node, rack, pod)"


def test_cordoned_nodes_and_unhealthy_gpus_are_never_used() -> None:
    nodes = [node("cordoned", schedulable=False), node("sick", free={0, 1, 2}), node("other", gpu_type="L40S", gpus=4)]
    in_age_order = SchedulerConfig(short_job_boost=0.0)
    decisions = run_cycle(snap(nodes, [job("a", 3, queued_at=0), job("b", 1, queued_at=1)], config=in_age_order), 5.0)
    assert placed(decisions) == {"a": [("sick", (0, 1, 2))]}
    assert decisions.pending_codes["b"] == Pending.NO_FREE_NODE
    assert decisions.pending_reasons["b"] == "no H100 node has 1 free GPUs; holds a reservation on sick from 01:00 UTC, in 1 h"


def test_a_gpu_held_by_a_running_job_is_never_bound_even_if_the_view_says_free() -> None:
    busy = running("r", {"n": (0, 1, 2, 3, 4, 5, 6)})
    snapshot = Snapshot(nodes=(node("n"),), pending=(job("j", 2),), running=(busy,))  # the view wrongly lists all 8 free
    decisions = run_cycle(snapshot, 0.0)
    assert (
        decisions.binds == ()
        and decisions.pending_reasons["j"] == "no H100 node has 2 free GPUs; holds a reservation on n from 01:00 UTC, in 1 h"
    )


def test_a_job_bigger_than_any_node_shape_can_never_fit() -> None:
    decisions = run_cycle(snap([node("n", gpus=4, gpu_type="L40S")], [job("j", 6, gpu_type="L40S", level="node")]), 0.0)
    assert decisions.pending_codes["j"] == Pending.NODE_TOO_SMALL
    assert decisions.pending_reasons["j"] == "node shape can never fit: 6 GPUs on one node, the largest L40S node has 4"
    decisions = run_cycle(snap([node("n")], [job("j", 1, gpu_type="B200")]), 0.0)
    assert decisions.pending_codes["j"] == Pending.NO_GPU_TYPE
    assert decisions.pending_reasons["j"] == "node shape can never fit: no B200 node in the fleet"


def test_fragmentation_reports_stranded_gpus_and_the_largest_gang_placeable() -> None:
    nodes = [node("a", free={0, 1, 2}), node("b", free={4}), *leaf_nodes("l2", 2), node("c", gpus=4, gpu_type="L40S")]
    decisions = run_cycle(snap(nodes, []), 0.0)
    assert decisions.fragmentation is not None
    assert dict(decisions.fragmentation.stranded_gpus) == {"H100": 4, "L40S": 0}
    assert dict(decisions.fragmentation.largest_placeable) == {"H100": 16, "L40S": 4}
