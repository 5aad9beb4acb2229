"""A member's environment follows torchrun's contract: each member (one per node) is one launcher of
NPROC_PER_NODE processes, and, run as a single process, the process NODE_RANK of NNODES."""

from __future__ import annotations

import pytest

from worker_agent.launch import job_environment
from workflows.messages import LaunchInput


def member(rank: int, world: int, gpus: int) -> LaunchInput:
    return LaunchInput(
        job_id="j-1", attempt=3, allocation_id="a-1", node_id=f"h{rank + 1}", rank=rank, world_size=world,
        gpu_indices=list(range(gpus)), gpus_per_member=gpus, argv=["train"], env={"LR": "0.1"}, checkpoint_dir="/ckpt/a/j",
        grace_period_s=5.0, master_addr="h1", master_port=29500, resume_from="/ckpt/a/j/step-20",
    )  # fmt: skip


@pytest.mark.parametrize(("rank", "world", "gpus"), [(0, 1, 1), (0, 2, 8), (1, 2, 8), (3, 4, 4)])
def test_each_member_is_one_torchrun_launcher_and_a_consistent_single_process(rank: int, world: int, gpus: int) -> None:
    env = job_environment(member(rank, world, gpus), "/data/ckpt/a/j", base={"PATH": "/usr/bin", "FAIRGANG_NODE_TOKEN": "secret"})
    assert {k: env[k] for k in ("NNODES", "NODE_RANK", "NPROC_PER_NODE", "MASTER_ADDR", "MASTER_PORT")} == {
        "NNODES": str(world), "NODE_RANK": str(rank), "NPROC_PER_NODE": str(gpus), "MASTER_ADDR": "h1", "MASTER_PORT": "29500",
    }  # fmt: skip
    # As one process: rank NODE_RANK of NNODES, the only one on its node (what env:// rendezvous reads).
    single = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
    assert {k: env[k] for k in single} == dict(zip(single, (str(rank), str(world), "0", "1", str(rank), str(world)), strict=True))
    assert 0 <= int(env["RANK"]) < int(env["WORLD_SIZE"])
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(gpus)))
    assert env["CHECKPOINT_DIR"] == "/data/ckpt/a/j" and env["RESUME_FROM"] == "/ckpt/a/j/step-20" and env["FAIRGANG_ATTEMPT"] == "3"
    assert env["LR"] == "0.1" and env["PATH"] == "/usr/bin" and "FAIRGANG_NODE_TOKEN" not in env
