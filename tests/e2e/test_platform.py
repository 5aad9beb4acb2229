"""Jobs travel the whole way on real processes (issue: foundation, "Done when")."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.e2e.conftest import REPO, TERMINAL, Platform, job_spec

pytestmark = pytest.mark.e2e


def test_job_runs_a_real_process_and_succeeds_with_its_log(platform: Platform) -> None:
    code = "import os; print('hello from', os.environ['FAIRGANG_JOB_ID'], 'gpus', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['TOKEN'])"
    job = platform.submit(job_spec("hello", code, gpu_count=2, env={"TOKEN": "xyz"}))
    done = platform.wait_for(job["id"], TERMINAL)
    assert done["state"] == "SUCCEEDED", done
    assert done["exit_code"] == 0
    kinds = [e["kind"] for e in done["events"]]
    assert kinds == ["SUBMITTED", "PLACED", "LAUNCHING", "RUNNING", "SUCCEEDED"]
    assert done["allocation"]["state"] == "RELEASED"
    [member] = done["allocation"]["members"]
    with platform.client("alpha-token") as http:
        log = http.get(f"/v1/jobs/{job['id']}/logs").text
    assert f"hello from {job['id']} gpus {','.join(map(str, member['gpu_indices']))} xyz" in log


def test_failing_entrypoint_ends_failed_with_its_exit_code(platform: Platform) -> None:
    job = platform.submit(job_spec("fails", "import sys; print('bad things'); sys.exit(7)"))
    done = platform.wait_for(job["id"], TERMINAL)
    assert done["state"] == "FAILED" and done["exit_code"] == 7
    assert "exited with code 7" in done["end_reason"]


def test_entrypoint_that_cannot_start_ends_failed(platform: Platform) -> None:
    spec = job_spec("no-such-program", "")
    spec["entrypoint"] = ["/nonexistent/train"]
    done = platform.wait_for(platform.submit(spec)["id"], TERMINAL)
    assert done["state"] == "FAILED" and done["exit_code"] == 127
    assert "could not start" in done["end_reason"]


def test_cancel_stops_the_running_process_and_ends_cancelled(platform: Platform, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = (
        "import os, signal, sys, time\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(143)))\n"
        "time.sleep(600)\n"
    )
    job = platform.submit(job_spec("long-runner", code))
    platform.wait_for(job["id"], {"RUNNING"})
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(pid_file.read_text())
    with platform.client("alpha-token") as http:
        assert http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    done = platform.wait_for(job["id"], TERMINAL)
    assert done["state"] == "CANCELLED"
    assert done["allocation"]["state"] == "RELEASED"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with platform.client("alpha-token") as http:
        assert "got SIGTERM" in http.get(f"/v1/jobs/{job['id']}/logs").text


def test_repeated_submit_yields_one_job_and_one_workflow(platform: Platform) -> None:
    spec = job_spec("twice", "print('once')", idempotency_key="submit-twice-key")
    first, second = platform.submit(spec), platform.submit(spec)
    assert first["id"] == second["id"]
    platform.wait_for(first["id"], TERMINAL)

    async def count(query: str) -> int:
        client = await Client.connect(platform.temporal_address)
        return (await client.count_workflows(query)).count

    assert asyncio.run(count(f"WorkflowId = '{first['id']}'")) == 1
    # The search attributes make the Temporal UI a job browser.
    assert (
        asyncio.run(count(f"WorkflowId = '{first['id']}' AND Tenant = 'alpha' AND GpuType = 'H100-80GB' AND JobState = 'SUCCEEDED'")) == 1
    )


def test_sixteen_gpu_gang_runs_one_member_per_node_with_ranks(platform: Platform) -> None:
    code = "import os; print('rank', os.environ['RANK'], 'world', os.environ['WORLD_SIZE'], 'local', os.environ['LOCAL_WORLD_SIZE'])"
    job = platform.submit(job_spec("gang", code, gpu_count=16, topology={"level": "leaf"}))
    done = platform.wait_for(job["id"], TERMINAL)
    assert done["state"] == "SUCCEEDED", done
    members = done["allocation"]["members"]
    assert sorted(m["node_id"] for m in members) == ["h1", "h2"]
    with platform.client("alpha-token") as http:
        for rank in (0, 1):
            log = http.get(f"/v1/jobs/{job['id']}/logs", params={"rank": rank}).text
            assert f"rank {rank} world 16 local 8" in log


def test_cli_submits_waits_and_lists(platform: Platform, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(json.dumps(job_spec("from-cli", "print('cli ok')")))
    env = {**os.environ, "FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": "alpha-token"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "fairgang.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    submitted = cli("submit", str(spec_file), "--wait", "-o", "json")
    assert submitted.returncode == 0, submitted.stderr
    job: dict[str, Any] = json.loads(submitted.stdout)
    assert job["state"] == "SUCCEEDED"
    listed = json.loads(cli("jobs", "-o", "json").stdout)
    assert job["id"] in [j["id"] for j in listed]
    assert "cli ok" in cli("logs", job["id"]).stdout
    table = cli("job", job["id"]).stdout
    assert "SUCCEEDED" in table and "PLACED" in table
    assert "h1" in cli("fleet").stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nentrypoint: [a]\ngpu_type: H100-80GB\ngpu_count: 1\nmax_runtime: 1h\ncheckpoint_dir: /tmp/elsewhere\n")
    refused = cli("submit", str(bad))
    assert refused.returncode == 1 and "checkpoint_dir" in refused.stderr


def test_kill_9_of_dev_while_a_job_waits_then_restart_runs_it(platform_factory: Any) -> None:
    p: Platform = platform_factory()
    p.start()
    blocker = p.submit(job_spec("blocker", "import time; time.sleep(4)", gpu_type="L40S", gpu_count=4, checkpoint_dir="/ckpt/alpha/b"))
    p.wait_for(blocker["id"], {"RUNNING"})
    waiting = p.submit(job_spec("waiter", "print('finally ran')", gpu_type="L40S", gpu_count=4, checkpoint_dir="/ckpt/alpha/w"))
    deadline = time.monotonic() + 30
    while not (p.job(waiting["id"]).get("pending_reason") or "").startswith("no L40S node"):
        assert time.monotonic() < deadline, p.job(waiting["id"])
        time.sleep(0.2)
    assert p.job(waiting["id"])["state"] == "QUEUED"
    p.kill9()
    p.start()
    done = p.wait_for(waiting["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED", done
    assert p.wait_for(blocker["id"], TERMINAL, timeout=60)["state"] == "SUCCEEDED"
