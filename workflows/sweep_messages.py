"""Inputs and results of the sweep workflow and its activities (plain dataclasses, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workflows.messages import JobInput


@dataclass
class RunningTrial:
    index: int
    job_id: str


@dataclass
class SweepProgress:
    """All of the sweep workflow's state; carried over continue-as-new."""

    sweep_id: str
    trial_count: int
    max_concurrent: int
    #: The next trial to create and start.
    next_index: int = 0
    #: Trials started and not yet seen to end.
    running: list[RunningTrial] = field(default_factory=list)
    finished: int = 0
    #: Set once the sweep is cancelled: start no more trials, stop the running ones.
    cancel_reason: str | None = None
    #: Trials already sent their job's ``cancel`` signal.
    cancel_sent: list[int] = field(default_factory=list)


@dataclass
class SweepInput:
    """Start input of the ``Sweep`` workflow.

    The API creates the sweep first and passes its id; a schedule passes the spec instead,
    and the workflow's first activity creates the sweep of this run (id derived from the
    workflow id, so a retry creates nothing twice).
    """

    tenant: str
    sweep_id: str | None = None
    spec: dict[str, Any] | None = None
    schedule_id: str | None = None
    #: Continue as new after starting this many trials in one run (Temporal history and pending-children limits).
    batch_size: int = 100
    #: How often trials this run did not start itself (adopted across continue-as-new) are looked up.
    poll_s: float = 3.0
    progress: SweepProgress | None = None


@dataclass
class OpenSweepInput:
    workflow_id: str
    tenant: str
    sweep_id: str | None = None
    spec: dict[str, Any] | None = None
    schedule_id: str | None = None
    #: The first run of the workflow's chain: a schedule may start two runs under one workflow id
    #: (two actions within one second), each its own sweep.
    run_id: str = ""


@dataclass
class OpenSweepResult:
    sweep_id: str
    trial_count: int
    max_concurrent: int
    #: The sweep's stored state (CANCELLING: cancelled before its workflow ran; FAILED: refused).
    state: str


@dataclass
class TrialInput:
    sweep_id: str
    index: int


@dataclass
class TrialStart:
    """What became of creating a trial's job."""

    #: "created": start ``job`` as the child; "refused": admission refused it; "wait": the tenant is at its job cap.
    status: str
    job_id: str = ""
    job: JobInput | None = None
    reason: str = ""


@dataclass
class TrialStatesInput:
    job_ids: list[str]


@dataclass
class TrialStates:
    states: dict[str, str]


@dataclass
class FinishSweepInput:
    sweep_id: str
    cancelled: bool
    reason: str = ""


@dataclass
class SweepCancel:
    reason: str = "cancelled by user"


@dataclass
class SweepStatus:
    """What the ``status`` query returns."""

    sweep_id: str
    trial_count: int
    started: int
    running: list[int]
    finished: int
    cancelling: bool
