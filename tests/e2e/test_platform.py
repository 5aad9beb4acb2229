"""Jobs travel the whole way on real processes."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.client import Client, WorkflowExecutionStatus

from tests.e2e.conftest import REPO, RESTART_WITHIN_LEASE, TERMINAL, Platform, job_spec, only

pytestmark = pytest.mark.e2e


@only("sqlite")
def test_job_runs_a_real_process_and_succeeds_with_its_log(platform: Platform) -> None:
    code = (
        "import os, sys\n"
        "print('hello from', os.environ['FAIRGANG_JOB_ID'], 'gpus', os.environ['CUDA_VISIBLE_DEVICES'], os.environ['TOKEN'])\n"
        "print('and a warning on stderr', file=sys.stderr)"
    )
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
        assert http.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": 1, "rank": 0}).text == log
    assert f"hello from {job['id']} gpus {','.join(map(str, member['gpu_indices']))} xyz" in log
    assert "and a warning on stderr" in log  # stdout and stderr both go to the attempt's log
    # The job's detail lists each attempt's allocation: here one, released at the end.
    assert [(a["attempt"], a["state"], a["id"]) for a in done["allocations"]] == [(1, "RELEASED", done["allocation"]["id"])]


@only("postgres")
def test_failing_entrypoint_ends_failed_with_its_exit_code(platform: Platform) -> None:
    job = platform.submit(job_spec("fails", "import sys; print('bad things'); sys.exit(7)"))
    done = platform.wait_for(job["id"], TERMINAL)
    assert done["state"] == "FAILED" and done["exit_code"] == 7
    assert "exited with code 7" in done["end_reason"]


@only("sqlite")
def test_entrypoint_that_cannot_start_ends_failed(platform: Platform) -> None:
    spec = job_spec("no-such-program", "")
    spec["entrypoint"] = ["/nonexistent/train"]
    done = platform.wait_for(platform.submit(spec)["id"], TERMINAL)
    assert done["state"] == "FAILED" and done["exit_code"] == 127
    assert "could not start" in done["end_reason"]


@only("postgres")
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


@only("postgres")
def test_repeated_submit_yields_one_job_and_one_workflow(platform: Platform) -> None:
    spec = job_spec("twice", "print('once')", idempotency_key="submit-twice-key")
    first, second = platform.submit(spec), platform.submit(spec)
    assert first["id"] == second["id"]
    platform.wait_for(first["id"], TERMINAL)

    async def count(query: str) -> int:
        client = await Client.connect(platform.temporal_address)
        return (await client.count_workflows(query)).count

    assert asyncio.run(count(f"WorkflowId = '{first['id']}'")) == 1
    # The search attributes make the Temporal UI a job browser. The workflow sets JobState after the store's
    # transition, and Temporal's visibility follows a little later: wait for it within a bound.
    query = f"WorkflowId = '{first['id']}' AND Tenant = 'alpha' AND GpuType = 'H100-80GB' AND JobState = 'SUCCEEDED'"
    deadline = time.monotonic() + 30
    while asyncio.run(count(query)) != 1:
        assert time.monotonic() < deadline, f"no workflow matches {query}"
        time.sleep(0.2)


@only("sqlite")
def test_sixteen_gpu_gang_runs_one_member_per_node_with_ranks(platform: Platform) -> None:
    keys = ("NNODES", "NODE_RANK", "NPROC_PER_NODE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    code = f"import os; print(' '.join(k + '=' + os.environ[k] for k in {keys!r}))"
    job = platform.submit(job_spec("gang", code, gpu_count=16, topology={"level": "leaf"}))
    done = platform.wait_for(job["id"], TERMINAL)
    assert done["state"] == "SUCCEEDED", done
    members = done["allocation"]["members"]
    assert sorted(m["node_id"] for m in members) == ["h1", "h2"]
    with platform.client("alpha-token") as http:
        for rank in (0, 1):
            log = http.get(f"/v1/jobs/{job['id']}/logs", params={"rank": rank}).text
            # torchrun's contract: each member a launcher of 8 processes, or a single process of 2.
            want = f"NNODES=2 NODE_RANK={rank} NPROC_PER_NODE=8 RANK={rank} WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR="
            assert want + "127.0.0.1" in log, log  # rank 0's registered address (the local platform's nodes: loopback)


@only("sqlite")
def test_cli_submits_waits_and_lists(platform: Platform, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(json.dumps(job_spec("from-cli", "import sys; print('cli ok'); print('cli err', file=sys.stderr)")))
    env = {**os.environ, "FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": "alpha-token"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    submitted = cli("submit", str(spec_file), "--wait", "-o", "json")
    assert submitted.returncode == 0, submitted.stderr
    job: dict[str, Any] = json.loads(submitted.stdout)
    assert job["state"] == "SUCCEEDED"
    listed = json.loads(cli("jobs", "-o", "json").stdout)
    assert job["id"] in [j["id"] for j in listed]
    shown = cli("logs", job["id"], "--attempt", "1")
    assert shown.returncode == 0 and "cli ok" in shown.stdout and "cli err" in shown.stdout, shown
    table = cli("job", job["id"]).stdout
    assert "SUCCEEDED" in table and "PLACED" in table
    assert "h1" in cli("fleet").stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nentrypoint: [a]\ngpu_type: H100-80GB\ngpu_count: 1\nmax_runtime: 1h\ncheckpoint_dir: /tmp/elsewhere\n")
    refused = cli("submit", str(bad))
    assert refused.returncode == 1 and "checkpoint_dir" in refused.stderr


def _cli(platform: Platform, *args: str, token: str = "alpha-token") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": token}
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@only("sqlite")
def test_history_and_usage_from_the_cli_say_what_the_api_says(platform: Platform) -> None:
    started = time.time() - 1
    done = []
    for i in range(3):
        spec = job_spec(f"accounted-{i}", "import time; time.sleep(1)", gpu_count=1 + i, labels={"suite": "accounting"})
        done.append(platform.submit(spec))
    done = [platform.wait_for(j["id"], TERMINAL) for j in done]
    assert all(j["state"] == "SUCCEEDED" for j in done), done
    # sacct-like: every job of the range (through pages of one), newest first, as CSV.
    out = _cli(platform, "history", "--since", str(started), "-l", "suite=accounting", "--page-size", "1", "-o", "csv")
    assert out.returncode == 0, out.stderr
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [r["id"] for r in rows] == [j["id"] for j in sorted(done, key=lambda j: (-j["created_at"], j["id"]))]
    for row in rows:
        job = next(j for j in done if j["id"] == row["id"])
        elapsed = job["finished_at"] - job["started_at"]
        assert row["state"] == "SUCCEEDED" and row["exit_code"] == "0" and float(row["elapsed"]) == pytest.approx(elapsed)
        assert float(row["gpu_hours"]) == pytest.approx(job["gpu_count"] * elapsed / 3600, abs=1e-3)
    table = _cli(platform, "history", "--since", str(started), "-l", "suite=accounting")
    assert table.returncode == 0 and all(j["id"] in table.stdout for j in done), table.stdout
    # sreport-like: the API's usage report, as JSON and CSV.
    usage = _cli(platform, "usage", "--since", str(started), "-o", "json")
    assert usage.returncode == 0, usage.stderr
    with platform.client("alpha-token") as http:
        report = http.get("/v1/usage", params={"since": str(started)}).json()
    mine = {(r["tenant"], r["gpu_type"]): r for r in json.loads(usage.stdout)}
    assert mine.keys() == {(r["tenant"], r["gpu_type"]) for r in report["rows"]} and ("alpha", "H100-80GB") in mine
    assert mine[("alpha", "H100-80GB")]["jobs"] >= 3 and mine[("alpha", "H100-80GB")]["gpu_hours"] > 0
    as_csv = _cli(platform, "usage", "--since", str(started), "--by", "tenant", "-o", "csv")
    assert as_csv.returncode == 0 and as_csv.stdout.splitlines()[0].startswith("tenant,gpu_type,gpu_hours,guaranteed_gpu_hours")
    assert _cli(platform, "usage", "--by", "node").returncode == 1


@only("sqlite")
def test_cli_habits_overrides_generated_names_outputs_selectors_and_following(platform: Platform, tmp_path: Path) -> None:
    code = "import sys, time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(0.5)\nprint('the end')"
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(job_spec("habits", code, labels={"suite": "habits"})))
    # The same file twice with --generate-name: two jobs; sbatch-like overrides land in the spec.
    first = _cli(platform, "submit", str(spec_file), "--generate-name", "-o", "json")
    second = _cli(platform, "submit", str(spec_file), "--generate-name", "--gpus", "2", "--env", "MODE=fast", "--time", "10m", "-o", "json")
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    a, b = json.loads(first.stdout)["job"], json.loads(second.stdout)["job"]
    assert a["id"] != b["id"] and a["name"].startswith("habits-") and b["name"].startswith("habits-") and a["name"] != b["name"]
    assert b["gpu_count"] == 2 and b["spec"]["env"] == {"MODE": "fast"} and b["spec"]["max_runtime"] == 600
    assert _cli(platform, "submit", str(spec_file), "--env", "NOEQUALS").returncode == 1
    # Follow a log to the job's end; --wait shows the state as it changes, then the log.
    followed = _cli(platform, "logs", "-f", a["id"])
    assert followed.returncode == 0 and followed.stdout.index("line 0") < followed.stdout.index("the end"), followed
    waited = _cli(platform, "submit", str(spec_file), "--name", "habits-waited", "--wait")
    assert waited.returncode == 0, waited.stderr
    assert "QUEUED" in waited.stderr and "SUCCEEDED" in waited.stderr and "the end" in waited.stdout, waited
    # Outputs: the ids alone, YAML, the wide table; -l selects by label.
    names = _cli(platform, "jobs", "-l", "suite=habits", "-o", "name").stdout.split()
    assert set(names) >= {a["id"], b["id"]} and all(n.startswith("j-") for n in names)
    assert {j["id"] for j in yaml.safe_load(_cli(platform, "jobs", "-l", "suite=habits", "-o", "yaml").stdout)} == set(names)
    assert "LABELS" in _cli(platform, "jobs", "-o", "wide").stdout and "suite=habits" in _cli(platform, "jobs", "-o", "wide").stdout
    assert (
        "table, wide, json, yaml" not in (help_text := _cli(platform, "jobs", "--help").stdout) and "table|wide|json|yaml|name" in help_text
    )
    # Cancel by selector: every job of the label that has not ended; one that ended cannot be, exit status 1.
    sleeper = job_spec("habits-sleeper", "import time; time.sleep(300)", labels={"suite": "habits-cancel"})
    sleepers = [platform.submit(sleeper | {"name": f"habits-sleeper-{i}"}) for i in range(2)]
    cancelled = _cli(platform, "cancel", "-l", "suite=habits-cancel")
    assert cancelled.returncode == 0 and all(s["id"] in cancelled.stdout for s in sleepers), cancelled
    for s in sleepers:
        assert platform.wait_for(s["id"], TERMINAL)["state"] == "CANCELLED"
    again = _cli(platform, "cancel", sleepers[0]["id"], a["id"])
    assert again.returncode == 1 and a["id"] in again.stderr and "already ended" in again.stderr, again


@only("sqlite")
def test_a_held_job_waits_while_capacity_is_free_and_a_shortened_limit_reaches_its_workflow(platform: Platform) -> None:
    blocker = platform.submit(job_spec("hold-blocker", "import time; time.sleep(300)", gpu_count=16, topology={"level": "leaf"}))
    platform.wait_for(blocker["id"], {"RUNNING"})
    waiting = platform.submit(job_spec("hold-me", "import time; print('started', flush=True); time.sleep(120)", gpu_count=8))
    _wait_pending(platform, waiting["id"], "")
    held = _cli(platform, "hold", waiting["id"])
    assert held.returncode == 0 and "HELD" in held.stdout, held
    # Shorter than its sleep: the limit must reach the workflow, which started with the job's first one.
    updated = _cli(platform, "update", waiting["id"], "--time", "4s", "--priority-class", "low")
    assert updated.returncode == 0, updated.stderr
    assert _cli(platform, "update", waiting["id"], "--time", "2h").returncode == 1
    assert _cli(platform, "cancel", blocker["id"]).returncode == 0
    assert platform.wait_for(blocker["id"], TERMINAL)["state"] == "CANCELLED"
    # The H100s are free, and stay free for the held job: it is not placed however many cycles pass.
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        assert platform.job(waiting["id"])["state"] == "HELD"
        time.sleep(0.5)
    assert _cli(platform, "release", waiting["id"]).returncode == 0
    done = platform.wait_for(waiting["id"], TERMINAL, timeout=90)
    assert done["state"] == "TIMED_OUT" and done["finished_at"] - done["started_at"] < 60, done
    kinds = [e["kind"] for e in done["events"]]
    assert kinds.index("HELD") < kinds.index("UPDATED") < kinds.index("RELEASED") < kinds.index("RUNNING"), kinds


def _wait_pending(p: Platform, job_id: str, prefix: str) -> None:
    deadline = time.monotonic() + 30
    while not (p.job(job_id).get("pending_reason") or "").startswith(prefix):
        assert time.monotonic() < deadline, p.job(job_id)
        time.sleep(0.2)


@only("postgres")
def test_cli_cancels_a_queued_job_which_is_then_never_bound(platform: Platform) -> None:
    """`fairgang cancel ID` of a job whose workflow waits for placement: it ends at once, and the GPUs it waited for go elsewhere."""
    blocker = platform.submit(job_spec("l40s-holder", "import time; time.sleep(600)", gpu_type="L40S", gpu_count=4))
    platform.wait_for(blocker["id"], {"RUNNING"})
    waiter = platform.submit(job_spec("l40s-waiter", "print('must not run')", gpu_type="L40S", gpu_count=4))
    _wait_pending(platform, waiter["id"], "no L40S node")
    cancelled = _cli(platform, "cancel", waiter["id"])
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancel requested" in cancelled.stdout
    done = platform.wait_for(waiter["id"], TERMINAL, timeout=60)
    assert done["state"] == "CANCELLED" and "cancelled by tenant alpha" in (done["end_reason"] or ""), done
    assert [e["kind"] for e in done["events"]] == ["SUBMITTED", "CANCELLED"]
    assert done["allocation"] is None and done["allocations"] == []
    # Free the GPUs it waited for: it must not be bound to them (a few placement ticks later).
    assert _cli(platform, "cancel", blocker["id"]).returncode == 0
    assert platform.wait_for(blocker["id"], TERMINAL, timeout=60)["state"] == "CANCELLED"
    time.sleep(3.0)
    after = platform.job(waiter["id"])
    assert after["state"] == "CANCELLED" and after["allocations"] == [] and len(after["events"]) == 2, after
    with platform.client("alpha-token") as http:
        assert http.get(f"/v1/jobs/{waiter['id']}/logs").text == ""

    async def workflow_status() -> WorkflowExecutionStatus | None:
        client = await Client.connect(platform.temporal_address)
        return (await client.get_workflow_handle(waiter["id"]).describe()).status

    assert asyncio.run(workflow_status()) == WorkflowExecutionStatus.COMPLETED  # nothing is left waiting for a placement


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.timeout(900)  # three starts and two stops of the whole platform, on a loaded machine
def test_kill_9_of_dev_while_a_job_waits_then_restart_runs_it(platform_factory: Any, tmp_path: Path) -> None:
    p: Platform = platform_factory()
    # Leases long enough for a stop and a start of the whole platform on a loaded machine.
    p.extra_env.update(RESTART_WITHIN_LEASE)
    p.start()
    # The blocker holds the L40S node until the test lets it end (not for a fixed time: on a loaded machine
    # the waiter's pending reason may come later than any fixed time).
    release = tmp_path / "release"
    hold = f"import os, time\nt = time.time()\nwhile not os.path.exists({str(release)!r}) and time.time() - t < 300: time.sleep(0.1)"
    blocker = p.submit(job_spec("blocker", hold, gpu_type="L40S", gpu_count=4, checkpoint_dir="/ckpt/alpha/b"))
    p.wait_for(blocker["id"], {"RUNNING"})
    waiting = p.submit(job_spec("waiter", "print('finally ran')", gpu_type="L40S", gpu_count=4, checkpoint_dir="/ckpt/alpha/w"))
    _wait_pending(p, waiting["id"], "no L40S node")
    assert p.job(waiting["id"])["state"] == "QUEUED"
    p.kill9()
    p.own_process_group = True  # from here on a Ctrl-C reaches `fairgang dev` and all its parts, as in a terminal
    p.start()
    release.touch()
    done = p.wait_for(waiting["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED", done
    ended = p.wait_for(blocker["id"], TERMINAL, timeout=60)
    assert ended["state"] == "SUCCEEDED", f"{ended}\n{p.logs()}"

    # Ctrl-C while a job runs: `fairgang dev` stops every part and exits 0; the job's process runs on, within its
    # lease, for the platform's next start to adopt.
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    runner = p.submit(job_spec("runs-at-ctrl-c", code))
    p.wait_for(runner["id"], {"RUNNING"})
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    job_pid = int(pid_file.read_text())
    parts: dict[str, int] = json.loads((p.data_dir / "pids.json").read_text())
    assert {"temporal", "api", "worker", "scheduler", "agent-h1", "agent-h2", "agent-g1"} <= set(parts)
    assert not any(_gone(pid) for pid in [*parts.values(), job_pid])
    assert p.proc is not None
    os.killpg(p.proc.pid, signal.SIGINT)
    assert p.proc.wait(90) == 0, p.logs()
    left = {name: pid for name, pid in parts.items() if not _gone(pid)}
    assert left == {}, f"still running after Ctrl-C: {left}\n{p.logs()}"
    assert not _gone(job_pid), "the job's process ended with the platform"
    assert all(_port_free(port) for port in (p.api_port, p.temporal_port, p.ui_port))

    # A restart on the same data dir still has every earlier job, in the store and in Temporal.
    p.start()
    with p.client("admin-token") as http:
        listed = {j["id"]: j["state"] for j in http.get("/v1/jobs").json()}
    assert listed[blocker["id"]] == listed[waiting["id"]] == "SUCCEEDED" and runner["id"] in listed, listed

    async def workflows(job_id: str) -> int:
        client = await Client.connect(p.temporal_address)
        return (await client.count_workflows(f"WorkflowId = '{job_id}'")).count

    assert asyncio.run(workflows(waiting["id"])) == 1

    # The job running at the Ctrl-C was adopted by the restarted platform: the same process, its first attempt.
    def agent_logs() -> str:
        return "".join(f.read_text(errors="replace") for f in (p.data_dir / "process-logs").glob("agent-*.log"))

    deadline = time.monotonic() + 60
    while f"adopting the member of {runner['id']}" not in agent_logs():
        assert time.monotonic() < deadline, p.logs()
        time.sleep(0.5)
    with p.client("admin-token") as http:
        assert http.post(f"/v1/jobs/{runner['id']}/cancel").status_code == 200
    done = p.wait_for(runner["id"], TERMINAL, timeout=60)
    assert done["state"] == "CANCELLED", done
    assert _gone(job_pid), "the adopted process outlived its cancel"
    assert all(a["state"] == "RELEASED" for a in done["allocations"]), done["allocations"]
    # A cancelled job cancelled again from the CLI: answered as it is.
    assert _cli(p, "cancel", runner["id"]).returncode == 0
