"""The sweep workflow (SPEC R9.3): trials of one job template, each an ordinary job.

Each trial's job is created (admitted like any submitted job) by an activity, then started
as a child ``TrainingJob`` workflow whose id is the job id ``<sweep id>-<index>``: a retried
or replayed sweep finds the same ids, so no trial starts twice. At most ``max_concurrent``
trials are unfinished at once. After ``batch_size`` starts the workflow continues as new with
its state; trials still running are then adopted and watched through the store, since a new
run cannot await the previous run's child handles. Children are abandoned on close, so a
trial's job never dies with the sweep's run; cancelling a sweep goes through each job's
``cancel`` signal (graceful stop).

A cancel through Temporal (the UI, the CLI, a schedule's ``cancel_previous`` overlap policy) is
turned into the same graceful cancel. Store activities, a trial's start and the cancel signals
are shielded from it and run to their end first: a cancel landing while a trial's job is being
created must not leave that job created but never started (nor a trial never sent its cancel).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError, is_cancelled_exception

from workflows.job import GPU_TYPE, JOB_STATE, STORE_RETRY, TENANT

with workflow.unsafe.imports_passed_through():
    from fairgang.settings import CONTROL_TASK_QUEUE
    from workflows.messages import CancelRequest, JobOutcome
    from workflows.sweep_messages import (
        FinishSweepInput,
        OpenSweepInput,
        OpenSweepResult,
        RunningTrial,
        SweepCancel,
        SweepInput,
        SweepProgress,
        SweepStatus,
        TrialInput,
        TrialStart,
        TrialStates,
        TrialStatesInput,
    )

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"})
#: How long to wait before trying again a trial the tenant's concurrent-job cap held back.
AT_CAP_RETRY_S = 5.0
#: Why a sweep cancelled through Temporal (not through the ``cancel`` signal) stopped.
TEMPORAL_CANCEL = "sweep workflow cancelled through Temporal"
T = TypeVar("T")


async def _store(activity: str, arg: object, result_type: type | None = None) -> object:
    return await workflow.execute_activity(
        activity, arg, start_to_close_timeout=timedelta(seconds=60), retry_policy=STORE_RETRY, result_type=result_type
    )


@workflow.defn(name="Sweep")
class SweepWorkflow:
    def __init__(self) -> None:
        self.p: SweepProgress | None = None
        #: Trials whose child handle (started in this run) has completed.
        self.done_here: set[int] = set()
        #: Child handles started in this run, by trial index.
        self.handles: dict[int, workflow.ChildWorkflowHandle[object, JobOutcome]] = {}
        self.pending_cancel: str | None = None

    @workflow.signal
    def cancel(self, request: SweepCancel) -> None:
        """Start no more trials and stop the running ones gracefully."""
        if self.p is None:
            self.pending_cancel = self.pending_cancel or request.reason
        elif self.p.cancel_reason is None:
            self.p.cancel_reason = request.reason

    @workflow.query
    def status(self) -> SweepStatus:
        p = self.p
        if p is None:
            return SweepStatus(sweep_id="", trial_count=0, started=0, running=[], finished=0, cancelling=self.pending_cancel is not None)
        return SweepStatus(
            sweep_id=p.sweep_id,
            trial_count=p.trial_count,
            started=p.next_index,
            running=sorted(t.index for t in p.running),
            finished=p.finished,
            cancelling=p.cancel_reason is not None,
        )

    def _note_temporal_cancel(self) -> None:
        if self.p is None:
            self.pending_cancel = self.pending_cancel or TEMPORAL_CANCEL
        elif self.p.cancel_reason is None:
            self.p.cancel_reason = TEMPORAL_CANCEL

    async def _through_cancel(self, step: Awaitable[T]) -> T:
        """Run ``step`` to its end even if the workflow is cancelled through Temporal meanwhile.

        The cancel is then recorded as the sweep's cancel (start no more trials, stop the running
        ones), instead of cutting short a store write or a trial's start half way.
        """
        task = asyncio.ensure_future(step)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._note_temporal_cancel()
            return await task

    @workflow.run
    async def run(self, inp: SweepInput) -> dict[str, object]:
        if inp.progress is None:
            opened = await self._through_cancel(
                _store(
                    "open_sweep",
                    OpenSweepInput(
                        workflow_id=workflow.info().workflow_id,
                        run_id=workflow.info().first_execution_run_id,
                        tenant=inp.tenant,
                        sweep_id=inp.sweep_id,
                        spec=inp.spec,
                        schedule_id=inp.schedule_id,
                    ),
                    OpenSweepResult,
                )
            )
            assert isinstance(opened, OpenSweepResult)
            if opened.state == "FAILED":
                return {"sweep_id": opened.sweep_id, "state": "FAILED"}
            self.p = SweepProgress(sweep_id=opened.sweep_id, trial_count=opened.trial_count, max_concurrent=opened.max_concurrent)
            if opened.state == "CANCELLING":
                self.p.cancel_reason = "cancelled before it started"
        else:
            self.p = inp.progress
        if self.pending_cancel is not None and self.p.cancel_reason is None:
            self.p.cancel_reason = self.pending_cancel
        try:
            await self._drive(inp)
        except BaseException as err:
            if not is_cancelled_exception(err):
                raise
            # Cancelled through Temporal while waiting (UI, CLI, or a schedule's cancel-previous
            # overlap policy): stop the trials gracefully, like a cancel signal, and wait for them.
            self._note_temporal_cancel()
            await self._drive(inp)
        finish = FinishSweepInput(sweep_id=self.p.sweep_id, cancelled=self.p.cancel_reason is not None)
        summary = await self._through_cancel(_store("finish_sweep", finish))
        await workflow.wait_condition(workflow.all_handlers_finished)
        assert isinstance(summary, dict)
        return summary

    async def _drive(self, inp: SweepInput) -> None:
        """Start trials up to the cap, watch them end; continue as new after a batch of starts."""
        p = self.p
        assert p is not None
        started_here = 0
        while True:
            self._collect_done()
            if p.cancel_reason is not None:
                await self._cancel_running(p.cancel_reason)
            elif len(p.running) < p.max_concurrent and p.next_index < p.trial_count:
                if started_here >= inp.batch_size or workflow.info().is_continue_as_new_suggested():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    workflow.continue_as_new(
                        SweepInput(
                            tenant=inp.tenant,
                            sweep_id=p.sweep_id,
                            schedule_id=inp.schedule_id,
                            batch_size=inp.batch_size,
                            poll_s=inp.poll_s,
                            progress=p,
                        )
                    )
                if await self._through_cancel(self._start_trial(p.next_index)):
                    started_here += 1
                continue
            if not p.running and (p.next_index >= p.trial_count or p.cancel_reason is not None):
                return
            adopted = [t for t in p.running if t.index not in self.handles]
            try:
                await workflow.wait_condition(
                    lambda: bool(self.done_here) or (p.cancel_reason is not None and self._cancel_pending()),
                    timeout=inp.poll_s if adopted else None,
                )
            except TimeoutError:
                await self._poll_adopted(adopted)

    def _cancel_pending(self) -> bool:
        assert self.p is not None
        return any(t.index not in self.p.cancel_sent for t in self.p.running)

    def _collect_done(self) -> None:
        assert self.p is not None
        if not self.done_here:
            return
        before = len(self.p.running)
        self.p.running = [t for t in self.p.running if t.index not in self.done_here]
        self.p.finished += before - len(self.p.running)
        for index in self.done_here:
            self.handles.pop(index, None)
        self.done_here.clear()

    async def _poll_adopted(self, adopted: list[RunningTrial]) -> None:
        assert self.p is not None
        answer = await self._through_cancel(_store("trial_states", TrialStatesInput(job_ids=[t.job_id for t in adopted]), TrialStates))
        assert isinstance(answer, TrialStates)
        ended = {t.index for t in adopted if answer.states.get(t.job_id) in TERMINAL}
        self.done_here |= ended

    async def _start_trial(self, index: int) -> bool:
        """Create trial ``index``'s job and start its workflow. False when the tenant's job cap held it back."""
        p = self.p
        assert p is not None
        start = await _store("create_trial", TrialInput(sweep_id=p.sweep_id, index=index), TrialStart)
        assert isinstance(start, TrialStart)
        if start.status == "wait":
            try:
                await workflow.wait_condition(lambda: p.cancel_reason is not None, timeout=AT_CAP_RETRY_S)
            except TimeoutError:
                pass
            return False
        p.next_index = index + 1
        if start.status == "refused" or start.job is None:
            p.finished += 1
            return False
        p.running.append(RunningTrial(index=index, job_id=start.job_id))
        try:
            handle = await workflow.start_child_workflow(
                "TrainingJob",
                start.job,
                id=start.job_id,
                task_queue=CONTROL_TASK_QUEUE,
                result_type=JobOutcome,
                # The trial is a job in its own right: it outlives this run (continue-as-new) and the sweep.
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                execution_timeout=timedelta(days=30),
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(TENANT, start.job.tenant),
                        SearchAttributePair(GPU_TYPE, start.job.gpu_type),
                        SearchAttributePair(JOB_STATE, "QUEUED"),
                    ]
                ),
            )
        except WorkflowAlreadyStartedError:
            # Its workflow exists already (the placement service's reconciler started it, or an
            # earlier run did): watch it through the store instead of starting it again.
            return True
        self.handles[index] = handle
        handle.add_done_callback(lambda _f: self.done_here.add(index))
        return True

    async def _cancel_running(self, reason: str) -> None:
        p = self.p
        assert p is not None
        for trial in p.running:
            if trial.index in p.cancel_sent:
                continue
            p.cancel_sent.append(trial.index)
            request = CancelRequest(reason=f"sweep {p.sweep_id}: {reason}")
            handle = self.handles.get(trial.index)
            try:
                if handle is not None:
                    await self._through_cancel(handle.signal("cancel", request))
                else:
                    await self._through_cancel(workflow.get_external_workflow_handle(trial.job_id).signal("cancel", request))
            except Exception as err:  # noqa: BLE001 - a workflow that already ended cannot be signalled: nothing to stop
                workflow.logger.info("could not signal cancel to %s: %s", trial.job_id, err)
