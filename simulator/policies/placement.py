"""Placement shared by the baseline policies (never by the production core).

Best fit on the topology: a single-node gang goes to the node of its type with the fewest
free GPUs that still hold it (packing, SPEC R3.3); a multi-node gang takes whole free nodes
inside the one domain of its topology level with the fewest whole free nodes that suffice.
Tentative takes consume the index and :meth:`FreeIndex.give` undoes them, so a cycle never
copies the snapshot.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from scheduler.core.types import Member, NodeView, PendingJob, RunningJob, Snapshot

_NOTHING: frozenset[str] = frozenset()


class FreeIndex:
    """Free GPUs of the schedulable nodes, bucketed per GPU type by free count.

    An index can be kept across cycles: :meth:`sync` undoes the last cycle's tentative
    takes and then looks only at the nodes whose view changed (the simulator reuses the
    view of an unchanged node), so a cycle costs O(nodes changed), not O(fleet).
    """

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self.node: dict[str, NodeView] = {}
        self.free: dict[str, set[int]] = {}
        #: type -> free count -> node ids with exactly that many free GPUs (insertion-ordered).
        self.buckets: dict[str, list[dict[str, None]]] = {}
        self.size: dict[str, int] = {}
        #: Free GPUs on schedulable nodes, per type (a gang bigger than this cannot fit anywhere).
        self.total: dict[str, int] = {}
        #: Free sets as they were before this cycle's first take or give on the node.
        self._before: dict[str, set[int]] = {}
        #: Smallest count found not to fit, per (type, level), since the last give().
        self._unfit: dict[tuple[str, str], int] = {}
        if snapshot is not None:
            self.sync(snapshot)

    def _rebuild(self, nodes: tuple[NodeView, ...]) -> None:
        self.node, self.free, self.buckets, self.size, self.total = {}, {}, {}, {}, {}
        for n in nodes:
            self.size[n.gpu_type] = max(self.size.get(n.gpu_type, 0), n.gpu_count)
        for gpu_type, size in self.size.items():
            self.buckets[gpu_type] = [{} for _ in range(size + 1)]
        for n in nodes:
            self.node[n.id] = n
            self.free[n.id] = set(n.free)
            if n.schedulable:
                self.buckets[n.gpu_type][len(n.free)][n.id] = None
                self.total[n.gpu_type] = self.total.get(n.gpu_type, 0) + len(n.free)

    def sync(self, snapshot: Snapshot) -> None:
        """Make the index match ``snapshot`` (and forget the previous cycle's tentative takes)."""
        nodes = snapshot.nodes
        self._unfit.clear()
        known = self.node
        if len(nodes) != len(known):
            self._before.clear()
            self._rebuild(nodes)
            return
        for node_id, old in self._before.items():
            view = known[node_id]
            if view.schedulable:
                self._move(node_id, len(self.free[node_id]), len(old))
            self.free[node_id] = old
        self._before.clear()
        for n in nodes:
            was = known.get(n.id)
            if n is was:
                continue
            if was is None or was.gpu_type != n.gpu_type or was.gpu_count != n.gpu_count:
                self._rebuild(nodes)
                return
            buckets = self.buckets[n.gpu_type]
            if was.schedulable:
                del buckets[len(self.free[n.id])][n.id]
                self.total[n.gpu_type] -= len(self.free[n.id])
            known[n.id] = n
            self.free[n.id] = set(n.free)
            if n.schedulable:
                buckets[len(n.free)][n.id] = None
                self.total[n.gpu_type] = self.total.get(n.gpu_type, 0) + len(n.free)

    def free_gpus(self, gpu_type: str) -> int:
        return self.total.get(gpu_type, 0)

    def _move(self, node_id: str, before: int, after: int) -> None:
        gpu_type = self.node[node_id].gpu_type
        buckets = self.buckets[gpu_type]
        del buckets[before][node_id]
        buckets[after][node_id] = None
        self.total[gpu_type] += after - before

    def find(self, job: PendingJob, avoid: Collection[str] = _NOTHING) -> tuple[Member, ...] | None:
        """Where the gang would go now (best fit), without taking it."""
        gpu_type, count = job.gpu_type, job.gpu_count
        if self.total.get(gpu_type, 0) < count:
            return None
        buckets = self.buckets.get(gpu_type)
        if not buckets:
            return None
        key = (gpu_type, job.topology_level)
        if not avoid and self._unfit.get(key, 1 << 30) <= count:
            return None
        size = self.size[gpu_type]
        found: tuple[Member, ...] | None = None
        if count <= size:
            for k in range(count, size + 1):
                for node_id in buckets[k]:
                    if node_id not in avoid:
                        found = (Member(node_id=node_id, gpu_indices=tuple(sorted(self.free[node_id])[:count]), rank=0),)
                        break
                if found:
                    break
        elif count % size == 0:
            found = self._whole_nodes(job, count // size, buckets[size], avoid)
        if found is None and not avoid:
            self._unfit[key] = min(count, self._unfit.get(key, 1 << 30))
        return found

    def _whole_nodes(self, job: PendingJob, need: int, whole: Iterable[str], avoid: Collection[str]) -> tuple[Member, ...] | None:
        level = job.topology_level
        groups: dict[str, list[str]] = {}
        for node_id in whole:
            if node_id in avoid:
                continue
            domain = "*" if level == "any" else self.node[node_id].domain(level)
            if domain is not None:
                groups.setdefault(domain, []).append(node_id)
        fits = [(len(ids), d) for d, ids in groups.items() if len(ids) >= need]
        if not fits:
            return None
        _, domain = min(fits)
        chosen = sorted(groups[domain])[:need]
        return tuple(Member(node_id=n, gpu_indices=tuple(sorted(self.free[n])), rank=r) for r, n in enumerate(chosen))

    def _remember(self, node_id: str) -> set[int]:
        free = self.free[node_id]
        if node_id not in self._before:
            self._before[node_id] = set(free)
        return free

    def take(self, members: Iterable[Member]) -> None:
        for m in members:
            free = self._remember(m.node_id)
            before = len(free)
            free.difference_update(m.gpu_indices)
            self._move(m.node_id, before, len(free))

    def give(self, members: Iterable[Member]) -> None:
        """Return GPUs (a victim's, or an undone take)."""
        for m in members:
            if m.node_id not in self.free or not self.node[m.node_id].schedulable:
                continue
            free = self._remember(m.node_id)
            before = len(free)
            free.update(m.gpu_indices)
            self._move(m.node_id, before, len(free))
        self._unfit.clear()

    def place(self, job: PendingJob, avoid: Collection[str] = _NOTHING) -> tuple[Member, ...] | None:
        """Find and take a place for the whole gang, or return None and change nothing."""
        members = self.find(job, avoid)
        if members is not None:
            self.take(members)
        return members


def submitted(job: PendingJob) -> float:
    """When the job first entered the queue (aging and FIFO count from here)."""
    return job.submitted_at if job.submitted_at is not None else job.queued_at


def runtime_guess(job: PendingJob) -> float:
    """The best run time the policy is told: the oracle's when given, else the user's limit."""
    return job.expected_runtime_s if job.expected_runtime_s is not None else job.max_runtime_s


def shadow(
    job: PendingJob, index: FreeIndex, running: Iterable[RunningJob], extra: Iterable[tuple[tuple[Member, ...], float]], now: float
) -> tuple[float, tuple[str, ...]] | None:
    """The earliest expected time the gang fits, and the nodes it would take then (EASY's reservation).

    Args:
        job: the blocked head.
        index: the free GPUs now (after this cycle's tentative binds).
        running: running jobs, which free their GPUs at their expected end.
        extra: (members, expected end) of jobs bound earlier in this cycle.
        now: the cycle's clock; an end already past counts as now.
    """
    gpu_type = job.gpu_type
    releases: dict[str, list[tuple[float, int]]] = {}
    for r in running:
        if r.gpu_type == gpu_type:
            for m in r.members:
                if m.node_id in index.free:
                    releases.setdefault(m.node_id, []).append((max(r.expected_end, now), len(m.gpu_indices)))
    for members, end in extra:
        for m in members:
            if m.node_id in index.free and index.node[m.node_id].gpu_type == gpu_type:
                releases.setdefault(m.node_id, []).append((max(end, now), len(m.gpu_indices)))
    size = index.size.get(gpu_type, 0)
    nodes = [n for n in index.node.values() if n.gpu_type == gpu_type]
    if not nodes:
        return None
    if job.gpu_count <= size:
        best: tuple[float, str] | None = None
        for n in nodes:
            have = len(index.free[n.id])
            at = now
            for end, gpus in sorted(releases.get(n.id, ())):
                if have >= job.gpu_count:
                    break
                have += gpus
                at = end
            if have >= job.gpu_count and (best is None or (at, n.id) < best):
                best = (at, n.id)
        return None if best is None else (best[0], (best[1],))
    if job.gpu_count % size:
        return None
    need = job.gpu_count // size
    level = job.topology_level
    by_domain: dict[str, list[tuple[float, str]]] = {}
    for n in nodes:
        if n.gpu_count != size:
            continue
        whole_at = max((end for end, _ in releases.get(n.id, ())), default=now)
        domain = "*" if level == "any" else n.domain(level)
        if domain is not None:
            by_domain.setdefault(domain, []).append((whole_at, n.id))
    options = []
    for domain, times in by_domain.items():
        if len(times) >= need:
            times.sort()
            options.append((times[need - 1][0], domain, tuple(n for _, n in times[:need])))
    if not options:
        return None
    at, _, chosen = min(options)
    return at, chosen
