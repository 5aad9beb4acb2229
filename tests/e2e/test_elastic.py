"""An elastic job on the whole platform with real torch.distributed (gloo on CPU): it starts at its minimum on a busy
fleet, grows onto a node when one frees, shrinks when a fixed job needs that node, and ends SUCCEEDED, its step
never going back further than its last checkpoint (SPEC R9.2). The job is ``examples/train_elastic_torch.py``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO, TERMINAL, Platform, job_spec

pytestmark = [pytest.mark.e2e, pytest.mark.parametrize("platform_factory", ["sqlite"], indirect=True)]

STEPS = 600


def log_of(platform: Platform, job_id: str, attempt: int = 1, rank: int = 0) -> str:
    with platform.client("admin-token") as http:
        return http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": attempt, "rank": rank}).text


def starts(log: str) -> list[tuple[int, int]]:
    """(step, world size) of every start of the members of rank 0, in order."""
    return [(int(s), int(w)) for s, w in re.findall(r"^start step (\d+) world (\d+) rank 0$", log, re.M)]


def wait_log(platform: Platform, job_id: str, what: str, check: Any, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = log_of(platform, job_id)
        if check(log):
            return log
        job = platform.job(job_id)
        assert job["state"] not in TERMINAL, (what, job, log)
        time.sleep(0.5)
    raise AssertionError(f"{what}: not seen in time\n{log_of(platform, job_id)}\n{platform.logs()}")


def check_never_went_back(log: str) -> None:
    """Each start goes on from the last checkpoint written before it, and every run's steps follow on one by one."""
    last_checkpoint, expected = 0, None
    for line in log.splitlines():
        if m := re.match(r"start step (\d+) world \d+ rank 0$", line):
            assert int(m[1]) == last_checkpoint, f"started at step {m[1]}, the last checkpoint was {last_checkpoint}"
            expected = int(m[1]) + 1
        elif m := re.match(r"step (\d+) world \d+ loss", line):
            assert int(m[1]) == expected, f"step {m[1]} after step {expected and expected - 1}"
            expected = int(m[1]) + 1
        elif m := re.match(r"checkpoint step-(\d+)\.pt", line):
            assert int(m[1]) >= last_checkpoint
            last_checkpoint = int(m[1])


@pytest.fixture(scope="module")
def elastic_platform(platform_factory: Any) -> Platform:
    if importlib.util.find_spec("torch") is None:
        reason = "torch is not installed (pip install torch==2.13.0, in the dev extra)"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    p: Platform = platform_factory()
    # GPUs idle 3 s are grown onto, by a job that has run 10 s at its size.
    p.extra_env.update({"FAIRGANG_ELASTIC_GROW_IDLE_S": "3", "FAIRGANG_ELASTIC_RESIZE_INTERVAL_S": "10"})
    p.start()
    return p


def test_an_elastic_torch_job_grows_shrinks_and_succeeds_from_its_checkpoints(elastic_platform: Platform, tmp_path: Path) -> None:
    p = elastic_platform
    blocker = p.submit(job_spec("blocker", "import time; time.sleep(600)", gpu_count=8, checkpoint_dir="/ckpt/beta/blocker"), "beta-token")
    p.wait_for(blocker["id"], {"RUNNING"})
    hold = tmp_path / "hold"
    hold.touch()  # the job does not take its last step before the test has seen it grow and shrink
    spec = job_spec("elastic", "", gpu_count={"min": 8, "max": 16}, max_runtime="30m", grace_period="20s")
    spec["entrypoint"] = [sys.executable, str(REPO / "examples" / "train_elastic_torch.py"), "--steps", str(STEPS),
                          "--checkpoint-every", "10", "--step-seconds", "0.05", "--hold-file", str(hold)]  # fmt: skip
    elastic = p.submit(spec)

    # 1. On a busy fleet it starts at its minimum: one node, a world of one.
    wait_log(p, elastic["id"], "the first start", lambda log: starts(log) and "step 12 world 1" in log)
    assert starts(log_of(p, elastic["id"]))[0] == (0, 1)
    shown = p.job(elastic["id"])
    assert (shown["gpu_count"], shown["gpu_max"], shown["gpus_now"]) == (8, 16, 8)

    # 2. Capacity frees: it grows onto the idle node, every member restarting from the checkpoint at a world of two.
    with p.client("beta-token") as http:
        assert http.post(f"/v1/jobs/{blocker['id']}/cancel").status_code == 200
    wait_log(p, elastic["id"], "the job grown to two members", lambda log: any(w == 2 for _, w in starts(log)))
    wait_log(p, elastic["id"], "steps at a world of two", lambda log: re.search(r"^step \d+ world 2 loss", log, re.M))
    assert p.job(elastic["id"])["gpus_now"] == 16

    # 3. A fixed job of another tenant needs a node: the elastic job gives back the one above its minimum.
    fixed = p.submit(job_spec("fixed", "import time; time.sleep(600)", gpu_count=8, checkpoint_dir="/ckpt/beta/fixed"), "beta-token")
    p.wait_for(fixed["id"], {"RUNNING"}, timeout=120)
    wait_log(p, elastic["id"], "the job shrunk back", lambda log: [w for _, w in starts(log)][-1:] == [1] and len(starts(log)) >= 3)
    wait_log(p, elastic["id"], "steps at a world of one again", lambda log: log.rsplit("world 2", 1)[-1].count(" world 1 loss") > 0)

    # 4. It finishes: SUCCEEDED in its first attempt, having resized twice, its steps never going back past a checkpoint.
    hold.unlink()
    done = p.wait_for(elastic["id"], TERMINAL, timeout=180)
    assert (done["state"], done["attempt"]) == ("SUCCEEDED", 1), done
    log = log_of(p, elastic["id"])
    assert [w for _, w in starts(log)][:3] == [1, 2, 1]
    check_never_went_back(log)
    assert f"finished {STEPS} steps" in log
    kinds = [e["kind"] for e in done["events"]]
    assert kinds.count("RESIZED") == 2 and "PREEMPTING" not in kinds and "REQUEUED" not in kinds
    resized = [(e["data"]["from_gpus"], e["data"]["to_gpus"]) for e in done["events"] if e["kind"] == "RESIZED"]
    assert resized == [(8, 16), (16, 8)]
    with p.client("beta-token") as http:
        assert http.post(f"/v1/jobs/{fixed['id']}/cancel").status_code == 200
