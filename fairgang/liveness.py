"""Node liveness: a node silent ``FAIRGANG_NODE_STALE_AFTER_S`` gets no new work; one silent
``FAIRGANG_NODE_LOST_AFTER_S`` is declared LOST.

Pure: the placement service's snapshot, the fleet view and the store's lost-node sweep call these
rules with the node's state, its last heartbeat and the time.
"""

from __future__ import annotations

#: A node an admin took out of the fleet for good: no work, no capacity, no credential; enrolling it again
#: brings it back (as DOWN, until its agent registers).
RETIRED = "RETIRED"

#: The states a silent node is declared LOST from (a DOWN node was never seen; a LOST one already is; a
#: RETIRED one is no longer part of the fleet).
LOSABLE_STATES = ("READY", "CORDONED")


def node_fresh(last_heartbeat: float | None, now: float, stale_after_s: float) -> bool:
    """Has the node been heard from within ``stale_after_s``?"""
    return last_heartbeat is not None and now - last_heartbeat <= stale_after_s


def node_schedulable(state: str, last_heartbeat: float | None, now: float, stale_after_s: float) -> bool:
    """May the node get new work: READY and fresh."""
    return state == "READY" and node_fresh(last_heartbeat, now, stale_after_s)


def lost_cutoff(now: float, lost_after_s: float) -> float:
    """A node whose last heartbeat is before this is lost (when its state is one of :data:`LOSABLE_STATES`)."""
    return now - lost_after_s


def node_lost(state: str, last_heartbeat: float | None, now: float, lost_after_s: float) -> bool:
    """Is the node to be declared LOST now?"""
    return state in LOSABLE_STATES and last_heartbeat is not None and last_heartbeat < lost_cutoff(now, lost_after_s)
