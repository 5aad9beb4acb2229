"""The fencing and node-liveness rules (fairgang.fencing, fairgang.liveness)."""

from __future__ import annotations

from fairgang import fencing, liveness


def test_a_heartbeat_answer_holding_the_allocation_extends_the_lease_from_its_send_time() -> None:
    assert fencing.renewed_lease_until(10.0, asked_at=8.0, lease_s=5.0, now=9.0) == 13.0
    assert fencing.renewed_lease_until(13.0, asked_at=8.0, lease_s=5.0, now=9.0) is None  # no extension: nothing to send
    # An answer that comes after the lease ran out renews nothing: the shim has stopped the member by then.
    assert fencing.renewed_lease_until(10.0, asked_at=9.0, lease_s=5.0, now=10.0) is None
    assert fencing.first_lease_until(100.0, now=101.0, activity_age_s=3.0, lease_s=5.0) == 103.0
    assert fencing.first_lease_until(100.0, now=101.0, activity_age_s=-1.0, lease_s=5.0) == 105.0
    assert fencing.lease_expired(10.0, 10.0) and not fencing.lease_expired(10.0, 9.9)


def test_agent_fences_what_the_answer_names_or_no_longer_holds_but_not_a_launch_after_the_request() -> None:
    launched = {"a1": 1.0, "a2": 1.0, "a3": 5.0, "a4": 1.0}
    named, unheld = fencing.agent_fences(launched, live=["a1"], asked_at=5.0, told=["a4", "gone"])
    assert named == ["a4"]
    assert unheld == ["a2", "a4"]  # a3 launched as the request was sent


def test_store_fence_verdict_and_the_wait_for_an_unconfirmed_member() -> None:
    assert fencing.store_fences(["a2", "a1", "a3"], ["a3"]) == ["a1", "a2"]
    assert fencing.fenced_event_key("a1", "n1") == "fenced-a1-n1"
    assert fencing.surely_dead_after_s(20.0, 30.0) == 20.0 + 30.0 + fencing.FENCE_MARGIN_S
    assert fencing.lease_too_short(14.9, 5.0) and not fencing.lease_too_short(15.0, 5.0)
    assert fencing.ended_fenced(False, 1, lease_until=5.0, now=5.0)
    assert not fencing.ended_fenced(False, 0, lease_until=5.0, now=6.0)
    assert fencing.ended_fenced(True, 0, lease_until=9.0, now=6.0)


def test_a_silent_node_gets_no_work_then_is_lost() -> None:
    assert liveness.node_schedulable("READY", 85.0, now=100.0, stale_after_s=15.0)
    assert not liveness.node_schedulable("READY", 84.9, now=100.0, stale_after_s=15.0)
    assert not liveness.node_schedulable("CORDONED", 100.0, now=100.0, stale_after_s=15.0)
    assert not liveness.node_schedulable("READY", None, now=100.0, stale_after_s=15.0)
    assert liveness.node_lost("CORDONED", 69.9, now=100.0, lost_after_s=30.0)
    assert not liveness.node_lost("READY", 70.0, now=100.0, lost_after_s=30.0)
    assert not liveness.node_lost("DOWN", 0.0, now=100.0, lost_after_s=30.0)
    assert not liveness.node_lost("READY", None, now=100.0, lost_after_s=30.0)
