"""The cycle's working copy of the fleet: indexed for fast placement, changed only through a journal.

Every change of a node's free GPUs goes through :meth:`Workspace.take` or
:meth:`Workspace.give`, which log their inverse. ``mark()`` / ``rollback(mark)`` undo
everything since the mark in O(GPUs touched), so a gang that does not fit, or a
preemption "what if", leaves no trace (Kueue's revert closures, Volcano's statements).

Indexes, per GPU type (a :class:`Pool`), kept current on every change:

- ``buckets[f]``: schedulable nodes with exactly ``f`` free GPUs, in node-id order, so
  best-fit for a single-node job is a walk up from ``f = count``;
- ``whole[level][domain]``: per topology domain, how many of its full-size nodes are
  wholly free, so a gang is a lookup of domain counts, not a scan of nodes.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

from scheduler.core.types import NodeView, RunningJob, Snapshot

#: A domain at some level: the node's label values from that level up to the top.
DomainKey = tuple[str, ...]


@dataclass(slots=True)
class NodeState:
    """One schedulable node in the working copy."""

    ord: int
    id: str
    gpu_type: str
    size: int
    free: set[int]
    #: Domain key per upper level (index 0 = the level just above "node").
    domains: tuple[DomainKey, ...]
    #: (expected end, GPUs) of every job holding GPUs here, including this cycle's binds. Ends
    #: are as the jobs say (possibly past); readers clamp them to the cycle's ``now``.
    ends: list[tuple[float, int]] = field(default_factory=list)
    #: Since when its free GPUs have been free (``NodeView.free_since``).
    free_since: float | None = None


@dataclass(slots=True)
class Hold:
    """A reservation's claim on one node for the rest of the cycle (EASY backfill)."""

    job_id: str
    start_at: float
    #: GPUs of this node the holder will not need at ``start_at``: long jobs may use them.
    spare: int
    #: Nothing else may use the node (backfill disabled).
    hard: bool = False


@dataclass(slots=True)
class Pool:
    """All nodes of one GPU type, with their indexes."""

    gpu_type: str
    #: Schedulable nodes in id order.
    nodes: list[NodeState]
    #: GPUs of this type on every node, schedulable or not (the DRF denominator).
    capacity: int
    #: The largest node of this type (schedulable or not): what "can never fit" is judged on.
    max_size: int
    #: The largest schedulable node; only nodes of this size take part in multi-node gangs.
    big: int
    buckets: list[list[int]]
    #: whole[level][domain] = wholly free big nodes in the domain.
    whole: list[dict[DomainKey, int]]
    whole_total: int
    #: children[level][domain] = its child domains one level down, sorted (level >= 1).
    children: list[dict[DomainKey, list[DomainKey]]]
    #: Big nodes per lowest-level domain, in id order.
    members: dict[DomainKey, list[NodeState]]
    #: static[level][domain] = GPUs of full-size nodes in the domain, schedulable or not.
    static: list[dict[DomainKey, int]]
    #: GPUs of full-size nodes in the whole pool, schedulable or not.
    static_total: int
    holds: dict[int, Hold] = field(default_factory=dict)
    #: Free GPUs on partly used schedulable nodes (fragmentation), kept current on every change.
    stranded: int = 0


def _domain_keys(node: NodeView, upper: tuple[str, ...]) -> tuple[DomainKey, ...]:
    values = tuple(node.domain(level) or "-" for level in upper)
    return tuple(values[i:] for i in range(len(upper)))


def upper_levels(topology_levels: tuple[str, ...]) -> tuple[str, ...]:
    """The topology levels above "node", lowest first."""
    return tuple(level for level in topology_levels if level != "node")


class Workspace:
    """Free GPUs per node, the per-type indexes, and the journal that undoes changes.

    A workspace may outlive its cycle (:class:`scheduler.core.incremental.Scheduler`): ``end_cycle``
    undoes everything the cycle did, and :class:`scheduler.core.incremental.FleetDiff` brings it to
    the next snapshot through ``set_node`` and ``running``, touching only the nodes whose view or
    running jobs changed. Node ordinals, pools and domains are fixed at construction, so any change
    of the fleet's shape (a node added, removed, cordoned, retyped or relabelled) means a new workspace.
    """

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.now = now
        self.upper: tuple[str, ...] = upper_levels(snapshot.topology_levels)
        held = _gpus_held_by_running(snapshot.running)
        all_nodes = sorted(snapshot.nodes, key=lambda n: n.id)
        self.running: dict[str, RunningJob] = {job.id: job for job in snapshot.running}
        #: Every change of this cycle (binds, holds of nominations), undone by ``end_cycle``.
        self._cycle_log: list[tuple[NodeState, tuple[int, ...], bool]] = []
        self._ends_added: list[NodeState] = []
        self.nodes: list[NodeState] = []
        self.by_id: dict[str, NodeState] = {}
        by_type: dict[str, list[NodeView]] = {}
        for view in all_nodes:
            by_type.setdefault(view.gpu_type, []).append(view)
        self.pools: dict[str, Pool] = {}
        for gpu_type in sorted(by_type):
            self.pools[gpu_type] = self._build_pool(gpu_type, by_type[gpu_type], held)
        for running in sorted(snapshot.running, key=lambda r: r.id):
            for member in running.members:
                node = self.by_id.get(member.node_id)
                if node is not None:
                    node.ends.append((running.expected_end, len(member.gpu_indices)))
        #: Per GPU type, the running jobs that may ever be victims: preemptible, on a schedulable node.
        self.victims: dict[str, dict[str, RunningJob]] = {}
        #: The fast lane's running jobs: those expected to use at most ``lane_gpu_s`` GPU-seconds in all
        #: (GPUs x (expected end - start)), by job id with their GPU type and count, and GPUs per type.
        self.lane_gpu_s = 0.0
        self.lane_jobs: dict[str, tuple[str, int]] = {}
        self.lane_held: dict[str, int] = {}
        #: Running elastic jobs, by id.
        self.elastic_running: dict[str, RunningJob] = {}
        for running in self.running.values():
            self.note_victim(running)
        self._journal: list[tuple[NodeState, tuple[int, ...], bool]] = []

    def _build_pool(self, gpu_type: str, views: list[NodeView], held: dict[str, set[int]]) -> Pool:
        levels = len(self.upper)
        sched = [v for v in views if v.schedulable]
        max_size = max(v.gpu_count for v in views)
        big = max((v.gpu_count for v in sched), default=0)
        pool = Pool(
            gpu_type=gpu_type,
            nodes=[],
            capacity=sum(v.gpu_count for v in views),
            max_size=max_size,
            big=big,
            buckets=[[] for _ in range(max_size + 1)],
            whole=[{} for _ in range(levels)],
            whole_total=0,
            children=[{} for _ in range(levels)],
            members={},
            static=[{} for _ in range(levels)],
            static_total=sum(v.gpu_count for v in views if v.gpu_count == max_size),
        )
        keys_by_labels: dict[tuple[tuple[str, str], ...], tuple[DomainKey, ...]] = {}
        for view in views:
            keys = keys_by_labels.get(view.labels)
            if keys is None:
                keys = keys_by_labels[view.labels] = _domain_keys(view, self.upper)
            if view.gpu_count == max_size:
                for i, key in enumerate(keys):
                    pool.static[i][key] = pool.static[i].get(key, 0) + view.gpu_count
            if not view.schedulable:
                continue
            free = {g for g in view.free if 0 <= g < view.gpu_count} - held.get(view.id, set())
            node = NodeState(
                ord=len(self.nodes),
                id=view.id,
                gpu_type=gpu_type,
                size=view.gpu_count,
                free=free,
                domains=keys,
                free_since=view.free_since,
            )
            self.nodes.append(node)
            self.by_id[node.id] = node
            pool.nodes.append(node)
            pool.buckets[len(free)].append(node.ord)
            if 0 < len(free) < node.size:
                pool.stranded += len(free)
            if view.gpu_count != big:
                continue
            for i, key in enumerate(keys):
                pool.whole[i].setdefault(key, 0)
                if i == 0:
                    pool.members.setdefault(key, []).append(node)
                else:
                    kids = pool.children[i].setdefault(key, [])
                    if keys[i - 1] not in kids:
                        kids.append(keys[i - 1])
            if len(free) == node.size:
                self._count_whole(pool, node, +1)
        for level in pool.children:
            for kids in level.values():
                kids.sort()
        return pool

    @staticmethod
    def _count_whole(pool: Pool, node: NodeState, delta: int) -> None:
        for i, key in enumerate(node.domains):
            pool.whole[i][key] += delta
        pool.whole_total += delta

    # ------------------------------------------------------------ changes

    def take(self, node: NodeState, gpus: tuple[int, ...]) -> None:
        """Mark ``gpus`` of ``node`` used (a bind, a hold, or a victim put back)."""
        self._change(node, gpus, add=False)
        self._journal.append((node, gpus, False))
        self._cycle_log.append((node, gpus, False))

    def give(self, node: NodeState, gpus: tuple[int, ...]) -> None:
        """Mark ``gpus`` of ``node`` free (a victim's GPUs in a preemption "what if")."""
        self._change(node, gpus, add=True)
        self._journal.append((node, gpus, True))
        self._cycle_log.append((node, gpus, True))

    def add_end(self, node: NodeState, end: float, gpus: int) -> None:
        """A job bound this cycle will free ``gpus`` of ``node`` at ``end``."""
        node.ends.append((end, gpus))
        self._ends_added.append(node)

    def mark(self) -> int:
        """A point to roll back to."""
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        """Undo every change since ``mark``, newest first."""
        while len(self._journal) > mark:
            node, gpus, added = self._journal.pop()
            self._cycle_log.pop()
            self._change(node, gpus, add=not added)

    def commit(self) -> None:
        """Forget the journal: what was done stays done."""
        self._journal.clear()

    def _change(self, node: NodeState, gpus: tuple[int, ...], *, add: bool) -> None:
        pool = self.pools[node.gpu_type]
        before = len(node.free)
        if add:
            node.free.update(gpus)
        else:
            node.free.difference_update(gpus)
        after = len(node.free)
        if before == after:
            return
        bucket = pool.buckets[before]
        del bucket[bisect_left(bucket, node.ord)]
        insort(pool.buckets[after], node.ord)
        pool.stranded += (after if 0 < after < node.size else 0) - (before if 0 < before < node.size else 0)
        if node.size == pool.big and (before == node.size) != (after == node.size):
            self._count_whole(pool, node, +1 if after == node.size else -1)

    # ------------------------------------------------------------ across cycles

    def end_cycle(self) -> None:
        """Undo the cycle: its binds, nominations and holds; the workspace is the snapshot's again."""
        while self._cycle_log:
            node, gpus, added = self._cycle_log.pop()
            self._change(node, gpus, add=not added)
        self._journal.clear()
        while self._ends_added:
            self._ends_added.pop().ends.pop()
        for pool in self.pools.values():
            pool.holds.clear()

    def in_cycle(self) -> bool:
        """Whether a cycle's changes are still in the workspace (``end_cycle`` has not undone them)."""
        return bool(self._cycle_log or self._ends_added)

    def set_node(self, node: NodeState, free: set[int], ends: list[tuple[float, int]]) -> None:
        """Make ``node``'s free GPUs ``free`` and its expected ends ``ends``, keeping the indexes current."""
        taken = tuple(node.free - free)
        if taken:
            self._change(node, taken, add=False)
        added = tuple(free - node.free)
        if added:
            self._change(node, added, add=True)
        node.ends = ends

    def note_victim(self, job: RunningJob) -> None:
        """A running job's view, new or again: count it among the GPU type's possible victims if it is preemptible
        and on a schedulable node, among the fast lane's running jobs if it is one, and the elastic ones."""
        if job.preemptible and any(m.node_id in self.by_id for m in job.members):
            self.victims.setdefault(job.gpu_type, {})[job.id] = job
        self._forget_lane(job.id)
        if job.gpu_count * (job.expected_end - job.started_at) <= self.lane_gpu_s:
            self.lane_jobs[job.id] = (job.gpu_type, job.gpu_count)
            self.lane_held[job.gpu_type] = self.lane_held.get(job.gpu_type, 0) + job.gpu_count
        if job.gpu_max is not None and job.elastic:
            self.elastic_running[job.id] = job
        else:
            self.elastic_running.pop(job.id, None)

    def forget_victim(self, job: RunningJob) -> None:
        """The job no longer runs as that view: out of the victims, the fast lane's running jobs and the elastic ones."""
        self.victims.get(job.gpu_type, {}).pop(job.id, None)
        self._forget_lane(job.id)
        self.elastic_running.pop(job.id, None)

    def _forget_lane(self, job_id: str) -> None:
        found = self.lane_jobs.pop(job_id, None)
        if found is not None:
            self.lane_held[found[0]] -= found[1]

    def lane_held_for(self, lane_gpu_s: float) -> dict[str, int]:
        """GPUs per type held by running jobs expected to use at most ``lane_gpu_s`` GPU-seconds (recounted only
        when the limit changed since the last call; kept current as running jobs come and go)."""
        if lane_gpu_s != self.lane_gpu_s:
            self.lane_gpu_s = lane_gpu_s
            self.lane_jobs.clear()
            self.lane_held.clear()
            for job in self.running.values():
                self.note_victim(job)
        return self.lane_held


def _gpus_held_by_running(running: tuple[RunningJob, ...]) -> dict[str, set[int]]:
    """GPUs of running jobs, which are never free whatever a node view says."""
    held: dict[str, set[int]] = {}
    for job in running:
        for member in job.members:
            held.setdefault(member.node_id, set()).update(member.gpu_indices)
    return held
