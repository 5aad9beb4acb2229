"""A data-parallel torch.distributed job that survives a change of size: an elastic job's example.

Each member (one per node) is one process of the gang: RANK of WORLD_SIZE, meeting at MASTER_ADDR:MASTER_PORT
(what the platform sets, as torchrun does for the processes it starts). It uses gloo, so it runs on CPUs too.

What makes it elastic (TorchElastic's model: a resize stops every member and starts them all again):

* the checkpoint does not depend on the world size: the model and the step, nothing per rank;
* the global batch is kept whatever the size: each step every member takes its shard of the same global
  batch (``batch[RANK::WORLD_SIZE]``), the gradients are summed across members and divided by the global batch
  size, so one step is the same update at any size (up to float rounding);
* on SIGTERM (a resize, a preemption) the members agree to stop after the same step (an all-reduce of the
  stop flag), rank 0 writes a checkpoint, and all exit; ``RESUME_FROM`` is where the next start goes on.

Rank 0 writes ``step-N.pt`` and then the ``LATEST`` marker in ``CHECKPOINT_DIR`` (both by atomic rename), which
is how the platform learns of it. Every start prints ``start step S world W`` and every step ``step S world W
loss L``, so a log shows the job never went back further than its last checkpoint.

Usage: python3 examples/train_elastic_torch.py --steps 400 --checkpoint-every 20 --step-seconds 0.05
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

stop_requested = False


def _on_sigterm(_signum: int, _frame: object) -> None:
    global stop_requested
    stop_requested = True


def save_checkpoint(directory: Path, step: int, weights: torch.Tensor) -> Path:
    """Write ``step-N.pt``, then point ``LATEST`` at it. Both appear whole or not at all."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step:08d}.pt"
    tmp = directory / f".step-{step:08d}.tmp"
    torch.save({"step": step, "weights": weights}, tmp)
    tmp.replace(path)
    marker = directory / ".LATEST.tmp"
    marker.write_text(path.name + "\n")
    marker.replace(directory / "LATEST")
    return path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.05, help="Extra time per step (stands for a bigger model).")
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hold-file", type=Path, help="Do not take the last step while this file exists (keeps a demo running).")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    address, port = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT", "29500")
    dist.init_process_group(
        "gloo", init_method=f"tcp://{address}:{port}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120)
    )

    # The data is synthetic but fixed (same seed on every start), so every member and every start see the same problem.
    gen = torch.Generator().manual_seed(1234)
    true_w = torch.randn(args.features, generator=gen, dtype=torch.float64)
    x = torch.randn(4096, args.features, generator=gen, dtype=torch.float64)
    y = x @ true_w + 0.01 * torch.randn(4096, generator=gen, dtype=torch.float64)

    checkpoint_dir = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    resume = os.environ.get("RESUME_FROM", "")
    weights, start = torch.zeros(args.features, dtype=torch.float64), 0
    if resume:
        state = torch.load(resume, weights_only=True)
        weights, start = state["weights"], int(state["step"])
    print(f"start step {start} world {world} rank {rank}", flush=True)

    def agree_to_stop() -> bool:
        """Whether any member was asked to stop: they all stop after the same step."""
        stop = torch.tensor([1.0 if stop_requested else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        return stop.item() > 0

    def stop_after(step: int) -> int:
        if rank == 0:
            print(f"checkpoint {save_checkpoint(checkpoint_dir, step, weights).name}", flush=True)
        print(f"stopping after step {step} (world {world})", flush=True)
        dist.destroy_process_group()
        return 0

    loss = float(torch.mean((x @ weights - y) ** 2))
    for step in range(start + 1, args.steps + 1):
        while step == args.steps and args.hold_file is not None and args.hold_file.exists():
            time.sleep(0.2)
            if agree_to_stop():
                return stop_after(step - 1)
        # The global batch of this step: the same on every member and at every size; this member's shard of it.
        batch = torch.randint(0, len(x), (args.global_batch,), generator=torch.Generator().manual_seed(step))
        mine = batch[rank::world]
        grad = 2 * x[mine].T @ (x[mine] @ weights - y[mine])
        dist.all_reduce(grad)  # summed over the members: the gradient of the whole global batch
        weights = weights - args.lr * grad / args.global_batch
        loss = float(torch.mean((x @ weights - y) ** 2))
        print(f"step {step} world {world} loss {loss:.6f}", flush=True)
        time.sleep(args.step_seconds)
        # Stop after the same step everywhere: any member's SIGTERM stops them all.
        if agree_to_stop():
            return stop_after(step)
        if rank == 0 and step % args.checkpoint_every == 0:
            print(f"checkpoint {save_checkpoint(checkpoint_dir, step, weights).name}", flush=True)
    print(f"finished {args.steps} steps, loss {loss:.6f}", flush=True)
    print(f"FAIRGANG_METRIC loss={loss:.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
