"""The policies a simulation can compare, all with the production core's shape ``(snapshot, now) -> Decisions``.

``ours`` is the production core itself, called unchanged (``scheduler.core.Scheduler``, kept across
cycles as the placement service keeps it); the baselines live in
this package and share only :mod:`simulator.policies.placement` among themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.core.types import Decisions, Snapshot
from simulator.policies.drf import Drf
from simulator.policies.las import TwoDLas
from simulator.policies.multifactor import MultifactorEasy
from simulator.policies.simple import Fifo, Sjf, StrictPriority

Policy = Callable[[Snapshot, float], Decisions]


def _ours() -> Policy:
    # Imported when asked for, so the baselines never depend on the production core's code.
    from scheduler.core import Scheduler

    return Scheduler().run_cycle


@dataclass(frozen=True)
class PolicySpec:
    """A policy by name: how to make a fresh instance, and what the simulator tells it."""

    name: str
    description: str
    make: Callable[[], Policy]
    #: Gets the true remaining run time as ``expected_runtime_s`` (the SJF oracle).
    oracle_runtime: bool = False
    #: Plans preemptions from ``last_checkpoint_at``, so the simulator keeps it fresh.
    needs_checkpoints: bool = False
    #: Runs the workload's elastic jobs as fixed jobs at their maximum (the rigid baseline).
    rigid: bool = False
    #: Gets learned run times (the production core's inputs, as the placement service gives them).
    learned_runtimes: bool = False


POLICIES: dict[str, PolicySpec] = {
    p.name: p
    for p in (
        PolicySpec("ours", "production core (scheduler.core.Scheduler), unchanged", _ours, needs_checkpoints=True, learned_runtimes=True),
        PolicySpec(
            "ours-rigid",
            "the production core with every elastic job fixed at its maximum",
            _ours,
            needs_checkpoints=True,
            rigid=True,
            learned_runtimes=True,
        ),
        PolicySpec("fifo", "FIFO per GPU type, head-of-line blocking", Fifo),
        PolicySpec("priority", "strict priority, no preemption", StrictPriority),
        PolicySpec("multifactor", "Slurm-style multifactor priority + EASY backfill", MultifactorEasy),
        PolicySpec("drf", "weighted DRF, no aging or reservations", Drf),
        PolicySpec("las", "Tiresias-style discretised 2D-LAS (preemptive)", TwoDLas),
        PolicySpec("sjf", "shortest job first with oracle durations", Sjf, oracle_runtime=True),
    )
}


def get_policy(name: str) -> PolicySpec:
    """The named policy, or ValueError listing the known names."""
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy '{name}' (known: {', '.join(POLICIES)})") from None


__all__ = ["POLICIES", "Policy", "PolicySpec", "get_policy"]
