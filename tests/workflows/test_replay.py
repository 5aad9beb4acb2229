"""Recorded job workflow histories replay on the current workflow code (a change that is not guarded by
``workflow.patched`` fails here with a non-determinism error).

``histories/``: a cancel of a running job, and a preemption of a running 2-member gang followed by a cancel
of its next attempt, each recorded with the workflow from before the `stop` activity (the stop reached the
members only with the launch's heartbeat) and with the workflow that sends it; and ``before-checkpoint-order-*``,
recorded by ``record_histories.py`` (which says how) with the workflow from before checkpoints were ordered: a job
that succeeds, fails, fails to start, times out, is cancelled (running, queued, and through Temporal), checkpoints
twice, gets its checkpoint reports out of order (that workflow recorded the older one, which came last), is
preempted and resumed from its checkpoint, loses a node, fails and is retried, and whose member's end is
unconfirmed (its launch failed, or stopped heartbeating) so that its allocation is fenced; and
``with-checkpoint-order-*``, some of the same recorded with the workflow that orders them (the out-of-order one holds
the ``newest-checkpoint-wins`` marker and records only the newer reports); and ``with-bounded-history-*``, recorded
with agents that report checkpoints to the store and the workflow that reads the latest from there and continues
as new on each requeue (``*-run-N`` are the runs that continued as new).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from activities.store import StoreActivities
from worker_agent.launch import LaunchActivities
from workflows.job import TrainingJobWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    await Replayer(workflows=[TrainingJobWorkflow]).replay_workflow(load(path))


def test_every_kind_of_history_is_there() -> None:
    assert {p.stem for p in HISTORIES} >= {
        "before-stop-activity-cancel", "before-stop-activity-preempt", "with-stop-activity-cancel", "with-stop-activity-preempt",
    }  # fmt: skip
    assert {p.stem for p in HISTORIES} >= {
        f"before-checkpoint-order-{name}"
        for name in (
            "succeeded", "failed", "start-failed", "timed-out", "cancelled", "cancelled-queued", "cancelled-through-temporal",
            "checkpoints", "checkpoints-out-of-order", "preempted-resumed", "node-lost", "failed-retried", "member-error-fenced",
            "heartbeat-lost-fenced",
        )
    }  # fmt: skip
    assert {p.stem for p in HISTORIES} >= {
        f"with-checkpoint-order-{name}"
        for name in ("checkpoints", "checkpoints-out-of-order", "preempted-resumed", "node-lost", "member-error-fenced", "cancelled")
    }
    # A member launched again for its restarted agent to adopt (relaunch-after-agent-restart): adopted, or not found.
    assert {p.stem for p in HISTORIES} >= {"with-relaunch-agent-restarted", "with-relaunch-heartbeat-lost-fenced"}
    # The workflow's status is the job's outcome (workflow-status-is-the-outcome).
    assert {p.stem for p in HISTORIES} >= {f"with-outcome-{n}" for n in ("failed", "timed-out", "cancelled-through-temporal", "cancelled")}
    # Checkpoints in the store, a run per attempt (checkpoints-in-store-continue-as-new).
    assert {p.stem for p in HISTORIES} >= {
        f"with-bounded-history-{n}{run}"
        for n in ("preempted-resumed", "node-lost", "failed-retried", "heartbeat-lost-fenced")
        for run in ("-run-1", "")
    } | {f"with-bounded-history-{n}" for n in ("checkpoints", "cancelled", "agent-restarted")}


def test_the_activities_keep_the_names_the_histories_call_them_by() -> None:
    def names(cls: type) -> set[str]:
        defined = [activity._Definition.from_callable(value) for value in vars(cls).values() if callable(value)]
        return {d.name for d in defined if d is not None and d.name is not None}

    assert names(StoreActivities) == {
        "mark_queued",
        "record_transition",
        "requeue",
        "revoke_allocation",
        "record_checkpoint",
        "latest_checkpoint",
        "resize",
    }
    assert names(LaunchActivities) == {"launch", "stop"}
