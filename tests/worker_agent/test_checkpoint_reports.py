"""Rank 0's launch activity reports each checkpoint the job names in CHECKPOINT_DIR/LATEST, numbered in order, so
that the store (and the workflow, from agents that signal it) can tell an older report that came late; other ranks
report nothing. Through the agent's reporter (to the store, by the API), a report that does not get through is tried
again at the next look, with the same number."""

from __future__ import annotations

import dataclasses
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from worker_agent.launch import LaunchActivities
from workflows.messages import CheckpointReport, LaunchInput

#: Points LATEST at step-1, then step-2, and exits 0. Rank 0 moves on once the test heard the report (argv[1]/heard-N,
#: within 60 s: however loaded the machine, the activity's once-a-second read sees each); other ranks after 1.5 s.
CHECKPOINTING = r"""
import os, sys, time
d, heard = os.environ["CHECKPOINT_DIR"], sys.argv[1]
for seq, name in enumerate(("step-1", "step-2"), start=1):
    open(os.path.join(d, name), "w").write(name)
    open(os.path.join(d, "LATEST.tmp"), "w").write(name + "\n")
    os.replace(os.path.join(d, "LATEST.tmp"), os.path.join(d, "LATEST"))
    deadline = time.time() + (60 if os.environ["RANK"] == "0" else 1.5)
    while time.time() < deadline and not os.path.exists(os.path.join(heard, f"heard-{seq}")):
        time.sleep(0.05)
"""


async def run_member(tmp_path: Path, rank: int, to_store: bool = False) -> list[CheckpointReport]:
    reports: list[CheckpointReport] = []
    tries: list[CheckpointReport] = []

    async def report(r: CheckpointReport) -> bool:
        """The agent's reporter: the first try of each report fails (the API did not answer)."""
        tries.append(r)
        if tries.count(r) == 1:
            return False
        reports.append(r)
        (tmp_path / f"heard-{r.seq}").touch()
        return True

    launcher = LaunchActivities(
        node_id="h1", log_dir=tmp_path / "logs", checkpoint_root=tmp_path / "root", report_checkpoint=report if to_store else None
    )

    async def signal(job_id: str, name: str, arg: object) -> None:
        if name == "checkpoint":
            assert isinstance(arg, CheckpointReport)
            reports.append(arg)
            (tmp_path / f"heard-{arg.seq}").touch()

    launcher._signal = signal  # type: ignore[method-assign]
    # What an earlier attempt left in the marker is not news.
    (tmp_path / "root" / "ckpt").mkdir(parents=True)
    (tmp_path / "root" / "ckpt" / "LATEST").write_text("step-0\n")
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC))
    inp = LaunchInput(
        job_id="j", attempt=2, allocation_id=f"a-{rank}", node_id="h1", rank=rank, world_size=2, gpu_indices=[0],
        gpus_per_member=1, argv=[sys.executable, "-c", CHECKPOINTING, str(tmp_path)], env={}, checkpoint_dir="/ckpt",
        grace_period_s=1.0, master_addr="h1", master_port=29500,
    )  # fmt: skip
    result = await env.run(launcher.launch, inp)
    assert result.exit_code == 0, result
    if rank == 0:
        assert result.checkpoint == str(tmp_path / "root" / "ckpt" / "step-2")
    return reports


@pytest.mark.parametrize("to_store", [True, False], ids=["to-store", "signalled"])
async def test_rank_0_numbers_its_checkpoint_reports_in_order(tmp_path: Path, to_store: bool) -> None:
    reports = await run_member(tmp_path, rank=0, to_store=to_store)
    ckpt = tmp_path / "root" / "ckpt"
    assert [(r.path, r.seq, r.attempt, r.allocation_id) for r in reports] == [
        (str(ckpt / "step-1"), 1, 2, "a-0"),
        (str(ckpt / "step-2"), 2, 2, "a-0"),
    ]


@pytest.mark.parametrize("to_store", [True, False], ids=["to-store", "signalled"])
async def test_other_ranks_report_no_checkpoint(tmp_path: Path, to_store: bool) -> None:
    assert await run_member(tmp_path, rank=1, to_store=to_store) == []
