"""A real (small) training job: linear regression by SGD on synthetic data, with NumPy.

It shows what a job does to be preemptible on fairgang:

* resume: when ``RESUME_FROM`` is set, load that checkpoint and go on from its step;
* checkpoint every ``--checkpoint-every`` steps, and on SIGTERM (the grace period is for
  that), each time writing the checkpoint file first and then the ``LATEST`` marker in
  ``CHECKPOINT_DIR`` (both by atomic rename), which is how the platform learns of it.

Usage: python3 examples/train_numpy.py --steps 200 --checkpoint-every 20 --step-seconds 0.05
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

stop_requested = False


def _on_sigterm(_signum: int, _frame: object) -> None:
    global stop_requested
    stop_requested = True


def save_checkpoint(directory: Path, step: int, weights: np.ndarray) -> Path:
    """Write ``step-N.npz``, then point ``LATEST`` at it. Both appear whole or not at all."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step:08d}.npz"
    tmp = directory / f".step-{step:08d}.tmp.npz"
    np.savez(tmp, weights=weights, step=step)
    tmp.replace(path)
    marker = directory / ".LATEST.tmp"
    marker.write_text(path.name + "\n")
    marker.replace(directory / "LATEST")
    return path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05, help="SGD learning rate.")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)

    # The data is synthetic but fixed (same seed on every attempt), so a resumed run continues the same problem.
    rng = np.random.default_rng(1234)
    true_w = rng.normal(size=args.features)
    x = rng.normal(size=(4096, args.features))
    y = x @ true_w + 0.01 * rng.normal(size=4096)

    checkpoint_dir = Path(os.environ.get("CHECKPOINT_DIR", "checkpoints"))
    resume = os.environ.get("RESUME_FROM", "")
    weights, start = np.zeros(args.features), 0
    if resume:
        state = np.load(resume)
        weights, start = state["weights"], int(state["step"])
        print(f"resumed from step {start} ({resume})", flush=True)
    else:
        print("starting from step 0", flush=True)
    attempt = os.environ.get("FAIRGANG_ATTEMPT", "1")

    loss = float(np.mean((x @ weights - y) ** 2))
    batch_rng = np.random.default_rng(start)
    for step in range(start + 1, args.steps + 1):
        idx = batch_rng.integers(0, len(x), size=64)
        grad = 2 * x[idx].T @ (x[idx] @ weights - y[idx]) / len(idx)
        weights = weights - args.lr * grad
        loss = float(np.mean((x @ weights - y) ** 2))
        print(f"attempt {attempt} step {step} loss {loss:.6f}", flush=True)
        time.sleep(args.step_seconds)
        # Like any data-parallel job, only rank 0 writes the (shared) checkpoint.
        if (step % args.checkpoint_every == 0 or stop_requested) and os.environ.get("RANK", "0") == "0":
            path = save_checkpoint(checkpoint_dir, step, weights)
            print(f"checkpoint {path.name}", flush=True)
        if stop_requested:
            print(f"SIGTERM: checkpointed step {step}, exiting", flush=True)
            return 0
    print(f"finished {args.steps} steps, loss {loss:.6f}", flush=True)
    # How a job reports a metric to the platform (a sweep picks its best trial by it).
    print(f"FAIRGANG_METRIC loss={loss:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
