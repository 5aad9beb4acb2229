"""Process settings, from the environment (FAIRGANG_*) and DATABASE_URL."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fairgang.isolation import DEFAULT_UID_BASE, DEFAULT_UID_SPAN

CONTROL_TASK_QUEUE = "fairgang-control"
SEARCH_ATTRIBUTES = {"Tenant": "Keyword", "GpuType": "Keyword", "JobState": "Keyword"}


def node_task_queue(node_id: str) -> str:
    """The Temporal task queue a node's agent polls."""
    return f"node-{node_id}"


class Settings(BaseSettings):
    """Settings shared by every fairgang process."""

    model_config = SettingsConfigDict(env_prefix="FAIRGANG_", extra="ignore")

    database_url: str = Field(
        default="sqlite+aiosqlite:///fairgang.db",
        validation_alias=AliasChoices("DATABASE_URL", "FAIRGANG_DATABASE_URL"),
    )
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    temporal_ui_url: str = "http://127.0.0.1:8233"
    api_url: str = "http://127.0.0.1:8080"
    #: How long the CLI waits for an API answer.
    cli_timeout_s: float = 30.0
    #: The API answers 413 to a request body over this many bytes, before reading it or authenticating.
    api_max_body_bytes: int = 256 * 1024
    #: A client whose bearer tokens were refused this many times in a minute gets 429 (0: no limit).
    auth_failures_per_minute: int = 30
    #: SQLite: how long the API's writes wait for the write lock before answering 503 (Retry-After).
    api_store_busy_timeout_s: float = 8.0
    #: Shared directory for per-attempt job logs (a shared filesystem in production).
    log_dir: Path = Path("fairgang-logs")
    #: Launch activities heartbeat; a member silent this long is treated as lost.
    activity_heartbeat_timeout_s: float = 20.0
    #: A member whose node's agent does not pick it up this long is lost.
    launch_start_timeout_s: float = 60.0
    #: How often agents heartbeat to the API.
    node_heartbeat_interval_s: float = 2.0
    #: The address other nodes reach this node's agent host at (a gang's rendezvous, ``MASTER_ADDR``, when its
    #: rank 0 runs here); None: the host's name.
    node_address: str | None = None
    #: A node silent this long gets no new work.
    node_stale_after_s: float = 15.0
    #: Placement service: cycle at least this often even without a wake-up.
    scheduler_tick_s: float = 5.0
    #: Placement service: how often it looks for a wake-up on stores without NOTIFY.
    scheduler_poll_s: float = 0.1
    #: Re-signal a binding its workflow has not acknowledged after this long.
    scheduler_resignal_after_s: float = 5.0
    #: The placement service's leader writes one fleet rollup row (the dashboard's charts) per bucket of this many
    #: seconds, and prunes rows older than the retention.
    rollup_bucket_s: float = Field(default=60.0, gt=0)
    rollup_retention_s: float = Field(default=8 * 86400.0, gt=0)
    #: The API keeps the queue's scored start estimates (``eta_record``: the calibrator's window and
    #: ``GET /v1/eta-accuracy``) this long after their jobs started; older ones are folded into the totals the
    #: ``fairgang_eta_*`` metrics count, and deleted.
    eta_retention_s: float = Field(default=30 * 86400.0, gt=0)
    #: Nodes mount checkpoint storage here; a spec's checkpoint_dir is taken relative to it. None: as written.
    checkpoint_root: Path | None = None
    #: Node-local directory where an agent remembers the processes it started.
    agent_state_dir: Path = Path("fairgang-agent-state")
    #: An agent run as root runs each member as its tenant's own unprivileged uid (fairgang/isolation.py),
    #: with a private temporary directory; off: members run as the agent's uid (no isolation between jobs).
    isolate_members: bool = True
    #: The range of the members' uids: [job_uid_base, job_uid_base + job_uid_span).
    job_uid_base: int = DEFAULT_UID_BASE
    job_uid_span: int = DEFAULT_UID_SPAN
    #: Where an isolated member's private temporary directory is made (None: the system's, /tmp).
    job_tmp_root: Path | None = None
    #: The key of the tokens' stored digests (HMAC-SHA256); set it on every process that writes or checks tokens
    #: (API, seeding). Without it digests are plain SHA-256; rows stored so are keyed at their next use.
    token_key: str | None = None
    #: The agent reads its node credential from this file (mode 0600), which keeps it out of the environment.
    node_token_file: Path | None = None
    #: An agent that cannot reach the API this long stops its members (they may be running elsewhere soon).
    self_fence_after_s: float = 20.0
    #: The placement service declares a node LOST when it has been silent this long.
    node_lost_after_s: float = 30.0
    #: Topology levels, narrowest first (from the cluster config's topology_levels).
    topology_levels: str = "node,leaf,spine"
    #: Scheduling policy (see docs/scheduler.md).
    usage_half_life_s: float = 3 * 3600.0
    aging_per_hour: float = 10.0
    max_wait_s: float = 6 * 3600.0
    #: A blocked job waiting this long takes its GPU type's reservation by age, whatever its tenant's share (0: never).
    reservation_by_age_after_s: float = Field(default=24 * 3600.0, ge=0.0)
    min_runtime_before_preempt_s: float = 600.0
    #: Each restart multiplies the time a job runs before it may be preempted again, up to max_wait_s (1: never).
    preempt_backoff: float = Field(default=2.0, ge=1.0)
    backfill: bool = True
    #: Priority points a small, short job gains within its tenant's queue (0: age order only).
    short_job_boost: float = 90.0
    short_job_ref_gpu_h: float = 64.0
    #: Jobs expected to use at most this many GPU-hours go first, in fair order among themselves (0: no fast lane).
    fast_lane_gpu_h: float = 8.0
    #: The most of a GPU type the fast lane's jobs may hold (share of its GPUs); beyond, short jobs queue fairly.
    fast_lane_max_share: float = 0.25
    #: Elastic jobs grow onto GPUs free this long while no job of their type waits.
    elastic_grow_idle_s: float = 300.0
    #: An elastic job grows at most once per this interval (shrinking for a waiting job is never delayed).
    elastic_resize_interval_s: float = 600.0
    #: A resize asked for and not committed in this time may be asked for again (its workflow dropped it).
    elastic_resize_timeout_s: float = 300.0
    #: A sweep workflow continues as new after starting this many trials (keeps its history short).
    sweep_batch_size: int = 100
    #: Infrastructure retries (lost node, agent gone) before a job ends FAILED.
    infra_retry_limit: int = 5
    infra_retry_backoff_s: float = 2.0
    #: GPU health policy (fairgang/health.py): Xids that take a GPU out of service ("48,63,92-95").
    health_fatal_xids: str = "48,63,64,74,79,92-95"
    #: Consecutive heartbeats of thermal or power throttling that cordon the node.
    health_throttle_beats: int = 5
    #: A rise of correctable ECC errors between two heartbeats that cordons the node.
    health_correctable_ecc_rise: int = 100
    #: Retired (or unremappable) pages that take a GPU out of service.
    health_retired_pages_fatal: int = 60
    #: Placement service: serve its Prometheus metrics on this port (None: off).
    scheduler_metrics_port: int | None = None
    #: The address metrics ports bind to.
    metrics_host: str = "127.0.0.1"
    #: host:port where this process exports the Temporal SDK's own metrics (None: off). One per process.
    temporal_metrics_bind: str | None = None

    def topology_level_names(self) -> tuple[str, ...]:
        """``topology_levels`` as names, narrowest first (blanks dropped)."""
        return tuple(level.strip() for level in self.topology_levels.split(",") if level.strip())


def normalise_database_url(url: str) -> str:
    """Accept the usual sync spellings and return the async driver's URL."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+asyncpg://" + url.split("://", 1)[1]
    if url.startswith("sqlite:///"):
        return "sqlite+aiosqlite:///" + url[len("sqlite:///") :]
    return url


def log_path(log_dir: Path, job_id: str, attempt: int, rank: int) -> Path:
    """Where a member's stdout and stderr go: one file per attempt and rank."""
    return log_dir / job_id / f"attempt-{attempt}-rank-{rank}.log"
