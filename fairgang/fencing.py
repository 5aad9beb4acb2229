"""Fencing (invariant 4): when a member whose allocation the store no longer holds must be stopped, and
when the control plane may take it for dead.

Pure: the node's agent, its launch activities, the job workflow and the store call these rules; the
member's shim (worker_agent/shim.py) runs the member lease's deadline on its own, importing nothing but
the standard library. Times on a node are :func:`worker_agent.shim.lease_clock` seconds; nothing here
reads a clock.

* A member holds a lease. It starts when its launch activity started (the store held the allocation
  then), and a heartbeat sent at ``t`` whose answer still holds the allocation extends it to
  ``t + lease`` (``lease`` is ``FAIRGANG_SELF_FENCE_AFTER_S``); once it runs out, the shim and the agent
  stop the member.
* The store's answer to a report of what a node runs fences every reported allocation it no longer
  holds, logged once per allocation and node as a ``FENCED`` event of its job.
* A workflow that cannot confirm a member's end revokes the allocation and takes the member for dead
  :func:`surely_dead_after_s` later.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

#: Added to the agents' member lease and the grace period before a member whose end is unconfirmed is taken
#: for dead: the shim's poll interval, the timer's and the node's clocks running apart, the reaping, and a
#: container CLI's own time to kill and remove a container (a second or two, more on a loaded node).
FENCE_MARGIN_S = 5.0
#: A member lease under this many heartbeat intervals runs out after a single slow heartbeat.
MIN_LEASE_HEARTBEATS = 3
#: The job event logged when a node reports an allocation the store no longer holds.
FENCED_EVENT = "FENCED"


def lease_too_short(lease_s: float, heartbeat_interval_s: float) -> bool:
    """Is the member lease so short that members may be fenced after a single slow heartbeat?"""
    return lease_s < MIN_LEASE_HEARTBEATS * heartbeat_interval_s


def first_lease_until(launched_at: float, now: float, activity_age_s: float, lease_s: float) -> float:
    """A new member's lease: from when its launch activity started (``activity_age_s`` before ``now``, read on
    the wall clock, never after ``launched_at``), plus the lease."""
    return min(launched_at, now - max(0.0, activity_age_s)) + lease_s


def renewed_lease_until(lease_until: float, asked_at: float, lease_s: float, now: float) -> float | None:
    """A heartbeat sent at ``asked_at`` answered holding the allocation, read at ``now``: the member's new lease
    end, or None when it does not extend the lease it holds. A lease that ran out before the answer came is
    never renewed: the member's shim stopped it at that end (the agent fences it), so its non-zero exit is the
    fencing's, not the job's."""
    if lease_expired(lease_until, now):
        return None
    until = asked_at + lease_s
    return until if until > lease_until else None


def lease_expired(lease_until: float, now: float) -> bool:
    """Has the member's lease run out?"""
    return lease_until <= now


def ended_fenced(fenced: bool, exit_code: int, lease_until: float, now: float) -> bool:
    """Was a member's end the agent's fencing (not the job's): the agent fenced it, or it failed after its lease
    ran out (its shim stopped it)."""
    return fenced or (exit_code != 0 and lease_expired(lease_until, now))


def agent_fences(
    launched_at: Mapping[str, float], live: Collection[str], asked_at: float, told: Collection[str] = ()
) -> tuple[list[str], list[str]]:
    """What an agent kills on the store's answer to a request sent at ``asked_at``.

    ``launched_at`` maps each allocation the agent runs to when its launch began; ``live`` is what the
    answer holds on the node and ``told`` the answer's own verdict (its ``fence``). Returns (the running
    allocations the answer names as fenced, the running ones it does not hold), each sorted; a member whose
    launch began at or after ``asked_at`` cannot be in the answer yet and is left alone.
    """
    named = sorted(set(told) & set(launched_at))
    unheld = sorted(a for a in set(launched_at) - set(live) if launched_at[a] < asked_at)
    return named, unheld


def store_fences(running: Collection[str], live: Collection[str]) -> list[str]:
    """The store's verdict on a node's report of what it runs: the allocations it no longer holds there, sorted."""
    return sorted(set(running) - set(live))


def fenced_event_key(allocation_id: str, node_id: str) -> str:
    """The dedupe key of the ``FENCED`` event: one per allocation and node."""
    return f"fenced-{allocation_id}-{node_id}"[:160]


def surely_dead_after_s(self_fence_after_s: float, grace_period_s: float) -> float:
    """How long after its allocation is revoked a member whose end is unconfirmed is surely dead: its lease, its
    grace period (the shim's SIGTERM to SIGKILL) and :data:`FENCE_MARGIN_S`."""
    return self_fence_after_s + grace_period_s + FENCE_MARGIN_S
