"""A tiny stand-in for a training script: counts steps, checkpoints, obeys SIGTERM.

Usage: python3 examples/train_tiny.py --steps 20 --step-seconds 0.1
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

stop = False


def _on_term(_signum: int, _frame: object) -> None:
    global stop
    stop = True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--fail-at", type=int, default=None, help="Exit 3 at this step (to show a failure).")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_term)
    rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
    print(f"job {os.environ.get('FAIRGANG_JOB_ID')} attempt {os.environ.get('FAIRGANG_ATTEMPT')} "
          f"rank {rank}/{world} on GPUs {os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)  # fmt: skip
    loss = 10.0
    for step in range(1, args.steps + 1):
        if stop:
            print(f"SIGTERM at step {step}: stopping", flush=True)
            return 143
        if args.fail_at is not None and step == args.fail_at:
            print(f"failing on purpose at step {step}", file=sys.stderr, flush=True)
            return 3
        loss *= 0.9
        print(f"step {step} loss {loss:.4f}", flush=True)
        time.sleep(args.step_seconds)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
