"""The long-lived :class:`Scheduler`: ``run_cycle``'s decisions, cycle after cycle, at the cost of what changed.

It keeps the working copy of the fleet (:class:`~scheduler.core.state.Workspace`) and the quota
book between cycles; at the end of each cycle it undoes the cycle's own changes from their
journals, and at the start of the next :class:`FleetDiff` compares the snapshot with the last
one: node views and running jobs that are the same objects cost nothing (found by identity at C
speed), equal ones a comparison, and only nodes whose view or jobs changed are recomputed. A
change of the fleet's shape, of a tenant's weight, cohort or quotas, or a cycle that raised,
makes the next cycle build afresh.
"""

from __future__ import annotations

from itertools import compress
from operator import is_not

from scheduler.core.cycle import cycle_on, decide
from scheduler.core.quota import QuotaBook, usage_of
from scheduler.core.state import Workspace, upper_levels
from scheduler.core.types import Decisions, NodeView, RunningJob, Snapshot

#: Per node: the running jobs holding GPUs there, each with its members on that node.
JobsOnNode = dict[str, tuple[RunningJob, list[tuple[int, ...]]]]


class Scheduler:
    """``run_cycle`` for a caller that runs cycle after cycle: the same decisions, less work.

    It keeps the workspace between cycles (undoing each cycle's own changes at its end) and
    brings it to the next snapshot by comparing node views and running jobs, so a cycle
    costs the changed nodes and jobs plus the queue, not the whole fleet. For every
    snapshot, ``Scheduler().run_cycle(s, t)`` and any long-lived instance's ``run_cycle(s, t)``
    equal ``run_cycle(s, t)`` (a property test holds it). A change of the fleet's shape, or a
    cycle that raised, makes the next cycle build afresh.
    """

    def __init__(self) -> None:
        self._ws: Workspace | None = None
        self._diff: FleetDiff | None = None
        self._book: QuotaBook | None = None
        self._usage: dict[tuple[str, str], int] = {}
        #: Cycles that reused the workspace, and cycles that built it.
        self.reused = 0
        self.rebuilt = 0

    def run_cycle(self, snapshot: Snapshot, now: float) -> Decisions:
        """The decisions of ``scheduler.core.run_cycle(snapshot, now)``."""
        ws, diff, book = self._ws, self._diff, self._book
        # Until the cycle ends cleanly: a cycle that raises leaves nothing to trust.
        self._ws = self._diff = self._book = None
        changed = diff.sync(ws, snapshot, now) if ws is not None and diff is not None else None
        if ws is None or changed is None:
            ws = Workspace(snapshot, now)
            diff = FleetDiff(snapshot)
            self._usage = usage_of(snapshot.running)
            book = None
            self.rebuilt += 1
        else:
            self.reused += 1
            for sign, jobs in ((-1, changed[0]), (1, changed[1])):
                for job in jobs:
                    key = (job.tenant, job.gpu_type)
                    left = self._usage.get(key, 0) + sign * job.entitled_gpus
                    if left:
                        self._usage[key] = left
                    else:
                        self._usage.pop(key, None)
                    if book is not None:
                        book.add(job.tenant, job.gpu_type, sign * job.entitled_gpus)
        if book is None or not book.sync_tenants(snapshot.tenants):
            book = QuotaBook(snapshot.tenants, usage=self._usage)
        book.logging = True
        decisions = decide(cycle_on(snapshot, now, ws, book), snapshot)
        ws.end_cycle()
        book.undo()
        self._ws, self._diff, self._book = ws, diff, book
        return decisions


class FleetDiff:
    """The snapshot a workspace was last brought to, and how to bring it to the next one."""

    def __init__(self, snapshot: Snapshot) -> None:
        #: What ``sync`` compares the next snapshot with.
        self._nodes_seen: tuple[NodeView, ...] = snapshot.nodes
        self._views: dict[str, NodeView] = {view.id: view for view in snapshot.nodes}
        self._running_seen: tuple[RunningJob, ...] = snapshot.running
        #: The running job views of the snapshot last seen, by object identity (they are kept alive here,
        #: so no new object can take an identity of theirs).
        self._running_objects: dict[int, RunningJob] = {id(job): job for job in snapshot.running}
        self._running_ids: set[int] = set(self._running_objects)
        self._jobs_on: dict[str, JobsOnNode] = {}
        for job in snapshot.running:
            self._place_running(job)

    def sync(self, ws: Workspace, snapshot: Snapshot, now: float) -> tuple[list[RunningJob], list[RunningJob]] | None:
        """Bring ``ws`` (at the last snapshot, its cycle undone) to ``snapshot``; None to rebuild, else the
        running jobs whose GPUs stopped and started counting against their tenants (a job whose tenant,
        type or size changed is in both).

        Unchanged views and jobs (the same objects, or equal ones) cost a comparison each.
        """
        if ws.in_cycle() or upper_levels(snapshot.topology_levels) != ws.upper:
            return None
        touched: set[str] = set()
        nodes = snapshot.nodes
        if nodes is not self._nodes_seen:
            seen = self._nodes_seen
            if len(nodes) != len(seen) or len(seen) != len(self._views):
                return None
            # Positions whose view is another object (found at C speed); each must still be the same node.
            for i in compress(range(len(nodes)), map(is_not, nodes, seen)):
                view, old = nodes[i], seen[i]
                if old.id != view.id or (old.gpu_type, old.gpu_count, old.labels, old.schedulable) != (
                    view.gpu_type,
                    view.gpu_count,
                    view.labels,
                    view.schedulable,
                ):
                    return None  # reordered, or the fleet's shape changed
                if old.free != view.free or old.free_since != view.free_since:
                    touched.add(view.id)
                self._views[view.id] = view
            self._nodes_seen = nodes
        gone: list[RunningJob] = []
        came: list[RunningJob] = []
        running = snapshot.running
        if running is not self._running_seen:
            # Set algebra on object identities (at C speed): only the jobs that are new objects cost Python work.
            now_ids = set(map(id, running))
            if len(now_ids) != len(running):
                return None  # the same object listed twice
            left_ids = self._running_ids - now_ids
            arrived_ids = now_ids - self._running_ids
            objects = self._running_objects
            left = [objects.pop(k) for k in left_ids]
            arrived = list(compress(running, map(arrived_ids.__contains__, map(id, running)))) if arrived_ids else []
            for job in arrived:
                objects[id(job)] = job
            self._running_ids = now_ids
            replaced = {job.id: job for job in left}
            moved: list[tuple[RunningJob | None, RunningJob | None]] = []
            for job in arrived:
                old_job = replaced.pop(job.id, None)
                if old_job is None:
                    if job.id in ws.running:
                        return None  # one job listed twice
                    moved.append((None, job))
                    came.append(job)
                    continue
                if old_job == job:
                    ws.running[job.id] = job
                    ws.note_victim(job)
                    continue
                # A new view of a job that was running (say, a newer checkpoint): the workspace
                # cares only where it runs and when it ends, the quota book only whose GPUs it holds.
                if old_job.members != job.members or old_job.expected_end != job.expected_end:
                    moved.append((old_job, job))
                else:
                    ws.running[job.id] = job
                    ws.forget_victim(old_job)
                    ws.note_victim(job)
                if (old_job.tenant, old_job.gpu_type, old_job.entitled_gpus) != (job.tenant, job.gpu_type, job.entitled_gpus):
                    gone.append(old_job)
                    came.append(job)
            for old_job in replaced.values():
                moved.append((old_job, None))
                gone.append(old_job)
            for before_job in (pair[0] for pair in moved):
                if before_job is not None:
                    del ws.running[before_job.id]
                    ws.forget_victim(before_job)
                    touched.update(self._unplace_running(before_job))
            for after_job in (pair[1] for pair in moved):
                if after_job is not None:
                    ws.running[after_job.id] = after_job
                    ws.note_victim(after_job)
                    touched.update(self._place_running(after_job))
            if len(ws.running) != len(running):
                return None
            self._running_seen = running
        for node_id in touched:
            self._refresh_node(ws, node_id)
        ws.now = now
        return gone, came

    def _place_running(self, job: RunningJob) -> set[str]:
        touched = set()
        for member in job.members:
            on_node = self._jobs_on.setdefault(member.node_id, {})
            entry = on_node.get(job.id)
            if entry is None:
                on_node[job.id] = (job, [member.gpu_indices])
            else:
                entry[1].append(member.gpu_indices)
            touched.add(member.node_id)
        return touched

    def _unplace_running(self, job: RunningJob) -> set[str]:
        touched = set()
        for member in job.members:
            on_node = self._jobs_on.get(member.node_id)
            if on_node is not None:
                on_node.pop(job.id, None)
            touched.add(member.node_id)
        return touched

    def _refresh_node(self, ws: Workspace, node_id: str) -> None:
        """Free GPUs and expected ends of one node, from its view and its running jobs (as the workspace builds them)."""
        node = ws.by_id.get(node_id)
        view = self._views.get(node_id)
        if node is None or view is None:
            return
        held: set[int] = set()
        ends: list[tuple[float, int]] = []
        for job, gpu_lists in self._jobs_on.get(node_id, {}).values():
            for gpus in gpu_lists:
                held.update(gpus)
                ends.append((job.expected_end, len(gpus)))
        ws.set_node(node, {g for g in view.free if 0 <= g < view.gpu_count} - held, ends)
        node.free_since = view.free_since
