"""Inputs and results that cross Temporal: one dataclass per workflow, signal and activity.

Plain dataclasses (Temporal's default converter; a ``JobState`` travels as its name), no I/O
imports, so the workflow sandbox passes them through.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fairgang.members import PlacedMember
from fairgang.spec import JobState

#: A launch activity raises this when its agent killed the member itself (fenced): its end is confirmed.
MEMBER_FENCED = "MemberFenced"
#: A launch to adopt a member finds none on its node (its record is gone): whether it still runs is unknown.
MEMBER_GONE = "MemberGone"
#: A launch activity ends with this when its agent stops (an upgrade, a restart): the member runs on, and the
#: workflow launches it again for the agent's next run to adopt.
AGENT_RESTARTING = "AgentRestarting"


@dataclass
class JobInput:
    """Start input of the job workflow: what it needs without reading the store."""

    job_id: str
    tenant: str
    gpu_type: str
    gpu_count: int
    argv: list[str]
    env: dict[str, str]
    checkpoint_dir: str
    max_runtime_s: float
    grace_period_s: float
    image: str = "local"
    retries: int = 0
    #: Launch activities heartbeat; silence this long means the member is lost.
    heartbeat_timeout_s: float = 20.0
    infra_retry_limit: int = 5
    infra_retry_backoff_s: float = 2.0
    attempt: int = 1
    #: A member whose node does not pick it up this long is lost (the node's agent is gone).
    launch_start_timeout_s: float = 60.0
    #: The agents' member lease (FAIRGANG_SELF_FENCE_AFTER_S): a member whose end is unconfirmed is dead this
    #: long plus its grace period after its allocation was revoked.
    self_fence_after_s: float = 20.0
    #: Carried over when the workflow continues as new (on each requeue): the failures counted so far, and a
    #: cancel that came while the previous run ended.
    own_failures: int = 0
    infra_failures: int = 0
    cancel_reason: str | None = None


@dataclass
class Placement:
    """Signal from the placement service: the attempt is bound to these GPUs.

    The binding is already committed when this is sent; (allocation_id, attempt) lets
    the workflow drop duplicates and stale ones.
    """

    allocation_id: str
    attempt: int
    members: list[PlacedMember]
    #: Where the members meet (rank 0's node address, ``MASTER_ADDR``); "": its node id.
    master_addr: str = ""


@dataclass
class ResizeRequest:
    """Signal from the placement service: resize the running elastic job's attempt to ``members``.

    The workflow stops every member gracefully (SIGTERM, grace, SIGKILL), has the store replace the allocation
    (``ResizeInput``), and launches every member again at the new size, resuming from the latest checkpoint. A
    resize is neither a failure nor a new attempt.
    """

    attempt: int
    allocation_id: str
    members: list[PlacedMember]
    from_gpus: int
    to_gpus: int
    #: "grow" onto idle GPUs ("idle"), or "shrink" for a waiting job ("waiting_job").
    reason: str = ""
    for_job: str = ""

    @property
    def direction(self) -> str:
        return "grow" if self.to_gpus > self.from_gpus else "shrink"


@dataclass
class ResizeInput:
    """Record a resize in the store: ``begin`` writes the RESIZING event; otherwise the allocation is replaced."""

    job_id: str
    attempt: int
    allocation_id: str
    members: list[PlacedMember]
    from_gpus: int
    to_gpus: int
    reason: str
    begin: bool = False


@dataclass
class ResizeResult:
    """The attempt's allocation after a resize: the new one, or (``refused`` says why) the one it had."""

    allocation_id: str
    members: list[PlacedMember]
    refused: str = ""
    #: Rank 0's node address after the resize ("": its node id).
    master_addr: str = ""


@dataclass
class CancelRequest:
    reason: str = "cancelled by user"


@dataclass
class PreemptRequest:
    """Stop the running attempt gracefully (SIGTERM, grace, SIGKILL) and queue the job again."""

    reason: str = "preempted by hand"
    #: Set by the placement service when the GPUs go to another job.
    for_job: str | None = None


@dataclass
class PreemptAnswer:
    accepted: bool
    message: str


@dataclass
class NodeLost:
    """Signal from the placement service: a node of the current placement stopped heartbeating."""

    node_id: str
    reason: str = "node stopped heartbeating"


@dataclass
class CheckpointReport:
    """Signal from rank 0's agent: the job wrote a new checkpoint (its LATEST marker changed)."""

    allocation_id: str
    attempt: int
    path: str
    #: The report's number among its launch activity's reports (1, 2, ...): a higher one names a newer checkpoint.
    #: 0 from an agent that does not number them.
    seq: int = 0


@dataclass
class LimitsChange:
    """A waiting job's limits, lowered by its owner (the store checked and recorded them first)."""

    max_runtime_s: float | None = None


@dataclass
class JobRef:
    job_id: str


@dataclass
class CheckpointInput:
    """Record the job's newest checkpoint; one older (by attempt, then ``seq``) than the one recorded is ignored."""

    job_id: str
    attempt: int
    path: str
    seq: int = 0


@dataclass
class MemberStarted:
    """Signal from an agent: the member's process is running."""

    allocation_id: str
    rank: int
    pid: int


@dataclass
class LaunchInput:
    """Launch one gang member's process on the node whose task queue runs this (built by the workflow's
    ``launch_input`` from the placement's member: its ``node_id``, ``rank`` and ``gpu_indices`` travel as fields of
    their own, which every version of the agent reads)."""

    job_id: str
    attempt: int
    allocation_id: str
    node_id: str
    rank: int
    world_size: int
    gpu_indices: list[int]
    gpus_per_member: int
    argv: list[str]
    env: dict[str, str]
    checkpoint_dir: str
    grace_period_s: float
    master_addr: str
    master_port: int
    resume_from: str = ""
    image: str = "local"
    #: The job's tenant: an isolating agent runs the member as the tenant's own uid (fairgang/isolation.py).
    tenant: str = ""
    #: The workflow launches this member again after its activity stopped heartbeating (its agent restarted):
    #: the agent watches the member it already runs and never starts another (MEMBER_GONE if it has none).
    adopt: bool = False


@dataclass
class LaunchResult:
    exit_code: int | None
    #: How the process ended: "exited", "terminated" (stopped by a ``stop`` activity: SIGTERM, the grace
    #: period, SIGKILL; or never started because its stop came first), "start_failed".
    how: str = "exited"
    error: str = ""
    checkpoint: str | None = None


@dataclass
class StopInput:
    """Stop one gang member now, on the node whose task queue runs this: SIGTERM to its process group,
    SIGKILL one grace period after that SIGTERM. The member's launch activity then ends as "terminated"."""

    job_id: str
    allocation_id: str
    attempt: int
    rank: int
    reason: str = ""


@dataclass
class StopResult:
    #: "signalled" (SIGTERM sent now, or at once when its process has started), "stopping" (a stop came
    #: before: nothing sent again), "absent" (nothing of the allocation runs here: its launch ended, or has
    #: not begun, and then it will not start the member).
    outcome: str


@dataclass
class QueuedInput:
    job_id: str
    attempt: int


@dataclass
class TransitionInput:
    job_id: str
    attempt: int
    state: JobState
    event_key: str
    message: str = ""
    allocation_id: str | None = None
    exit_code: int | None = None
    end_reason: str | None = None


@dataclass
class RequeueInput:
    job_id: str
    from_attempt: int
    reason: str


@dataclass
class RevokeInput:
    """Tell the agents the store no longer holds an allocation (its GPUs stay held until the requeue)."""

    job_id: str
    allocation_id: str
    reason: str


@dataclass
class JobOutcome:
    state: JobState
    attempt: int
    exit_code: int | None = None
    reason: str = ""


@dataclass
class JobStatus:
    """What the ``status`` query returns."""

    state: JobState
    attempt: int
    allocation_id: str | None = None
    started_members: list[int] = field(default_factory=list)
