"""Sweeps and scheduled sweeps on the whole platform.

Real Temporal dev server, real store, real API, worker, placement service and agents
(`fairgang dev`); trials are tiny real processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from tests.builders import max_overlap
from tests.e2e.conftest import REPO, Platform, only
from tests.e2e.test_lifecycle import log_of, resumed_step, wait_for_checkpoint

pytestmark = pytest.mark.e2e
SWEEP_DONE = {"COMPLETED", "CANCELLED", "FAILED"}


def sweep_spec(
    name: str, code: str, *, parameters: dict[str, Any], cap: int = 2, env: dict[str, str] | None = None, **extra: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "max_concurrent": cap,
        "parameters": parameters,
        "template": {
            "entrypoint": [sys.executable, "-c", code, *[f"{{{{{p}}}}}" for p in _names(parameters)]],
            "env": env or {},
            "gpu_type": "H100-80GB",
            "gpu_count": 1,
            "max_runtime": "10m",
            "checkpoint_dir": f"/ckpt/alpha/{name}",
            "grace_period": "3s",
        },
    }
    spec.update(extra)
    return spec


def _names(parameters: dict[str, Any]) -> list[str]:
    if "grid" in parameters:
        return list(parameters["grid"])
    if "list" in parameters:
        return list(parameters["list"][0])
    return sorted(parameters["random"]["space"])


def submit_sweep(p: Platform, spec: dict[str, Any], token: str = "alpha-token") -> dict[str, Any]:
    with p.client(token) as http:
        resp = http.post("/v1/sweeps", json=spec)
    assert resp.status_code in (200, 201), resp.text
    return dict(resp.json()["sweep"])


def get_sweep(p: Platform, sweep_id: str, token: str = "admin-token") -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        try:
            with p.client(token) as http:
                return dict(http.get(f"/v1/sweeps/{sweep_id}").json())
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def wait_sweep(p: Platform, sweep_id: str, until: Any, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    sweep: dict[str, Any] = {}
    while time.monotonic() < deadline:
        sweep = get_sweep(p, sweep_id)
        if until(sweep):
            return sweep
        time.sleep(0.3)
    raise AssertionError(f"sweep {sweep_id} never got there: {json.dumps(sweep, indent=1)[:4000]}\n{p.logs()}")


def count_workflows(p: Platform, query: str) -> int:
    async def count() -> int:
        client = await Client.connect(p.temporal_address)
        return (await client.count_workflows(query)).count

    return asyncio.run(count())


def started_workflows(p: Platform, query: str) -> int:
    """How many workflows the query matches, each counted once however many runs it has (a job's workflow
    continues as new on each requeue: its runs are one workflow, started once)."""

    async def ids() -> set[str]:
        client = await Client.connect(p.temporal_address)
        return {w.id async for w in client.list_workflows(query)}

    return len(asyncio.run(ids()))


GRID_CODE = (
    "import sys, time\n"
    "lr, features = float(sys.argv[1]), int(sys.argv[2])\n"
    "print('trial lr', sys.argv[1], 'features', sys.argv[2], flush=True)\n"
    "time.sleep(1.5)\n"
    "print(f'FAIRGANG_METRIC loss={abs(lr * features - 2)}', flush=True)\n"
)


@only("postgres")
def test_grid_sweep_runs_six_trials_with_their_parameters_two_at_once(platform: Platform) -> None:
    grid: dict[str, list[Any]] = {"lr": [0.1, 0.01, 0.001], "features": [2, 20]}
    spec = sweep_spec("grid", GRID_CODE, parameters={"grid": grid}, metric={"name": "loss"})
    sweep = submit_sweep(platform, spec)
    assert sweep["trial_count"] == 6

    def resubmit() -> None:
        """A retried submission (same spec, so the same idempotency key) is the same sweep, started once."""
        with platform.client("alpha-token") as http:
            again = http.post("/v1/sweeps", json=spec)
        assert again.status_code == 200, again.text
        assert again.json()["created"] is False and again.json()["sweep"]["id"] == sweep["id"]

    resubmit()
    done = wait_sweep(platform, sweep["id"], lambda s: s["state"] in SWEEP_DONE)
    resubmit()
    assert done["state"] == "COMPLETED", done
    trials = done["trials"]
    assert [t["params"] for t in trials] == [{"lr": lr, "features": f} for lr in grid["lr"] for f in grid["features"]]
    assert all(t["state"] == "SUCCEEDED" for t in trials), trials
    assert [t["job_id"] for t in trials] == [f"{sweep['id']}-{i:04d}" for i in range(6)]
    with platform.client("alpha-token") as http:
        for t in trials:
            log = http.get(f"/v1/jobs/{t['job_id']}/logs").text
            assert f"trial lr {t['params']['lr']} features {t['params']['features']}" in log
            assert http.get(f"/v1/jobs/{t['job_id']}").json()["attempt"] == 1
    # The cap: never more than 2 trials unfinished at once (and it was used).
    assert max_overlap([(t["created_at"], t["finished_at"]) for t in trials]) == 2
    summary = done["summary"]
    assert (summary["succeeded"], summary["failed"], summary["cancelled"]) == (6, 0, 0)
    # |lr * features - 2| is smallest (0) for lr 0.1 x 20 features: trial 1.
    assert summary["best"]["index"] == 1 and summary["best"]["value"] < 1e-9
    assert summary["best"]["params"] == {"lr": 0.1, "features": 20}
    # Each trial is a child workflow of the sweep's workflow, with the deterministic id, started once.
    assert started_workflows(platform, f"WorkflowId STARTS_WITH '{sweep['id']}-' AND WorkflowType = 'TrainingJob'") == 6
    assert started_workflows(platform, f"ParentWorkflowId = '{sweep['id']}' AND WorkflowType = 'TrainingJob'") == 6
    # Batches of 2 starts (FAIRGANG_SWEEP_BATCH_SIZE in the e2e platform): the sweep continued as new, 3 runs.
    assert count_workflows(platform, f"WorkflowId = '{sweep['id']}' AND WorkflowType = 'Sweep'") == 3
    # Tenant isolation: another tenant sees nothing of it.
    with platform.client("beta-token") as http:
        assert http.get(f"/v1/sweeps/{sweep['id']}").status_code == 404
        assert http.post(f"/v1/sweeps/{sweep['id']}/cancel").status_code == 404
        assert sweep["id"] not in [s["id"] for s in http.get("/v1/sweeps").json()]
    with platform.client("alpha-token") as http:
        assert [s["id"] for s in http.get("/v1/sweeps").json() if s["name"] == "grid"] == [sweep["id"]]


@only("sqlite")
def test_invalid_sweep_specs_are_refused_with_the_field_named(platform: Platform) -> None:
    good = sweep_spec("bad", "print(1)", parameters={"grid": {"x": [1]}})
    cases = [
        ({**good, "max_concurrent": 0}, "alpha-token", "max_concurrent"),
        ({**good, "parameters": {"grid": {"x": []}}}, "alpha-token", "parameters.grid"),
        ({**good, "template": {**good["template"], "gpu_type": "TPU"}}, "alpha-token", "template.gpu_type"),
        ({**good, "template": {**good["template"], "entrypoint": ["python3", "{{y}}"]}}, "alpha-token", "template.entrypoint.1"),
        ({**good, "template": {**good["template"], "max_runtime": "10h", "checkpoint_dir": "/b"}}, "beta-token", "template.max_runtime"),
    ]
    for body, token, field in cases:
        with platform.client(token) as http:
            resp = http.post("/v1/sweeps", json=body)
        assert resp.status_code == 422, resp.text
        assert field in [p["field"] for p in resp.json()["problems"]], resp.text
    # The spec's tenant: a tenant names only itself, an admin must name a known one (as for jobs).
    tenant_cases = [
        ({**good, "tenant": "beta"}, "alpha-token", 403),
        ({**good, "tenant": "nosuch"}, "admin-token", 422),
        (good, "admin-token", 422),
    ]
    for body, token, status in tenant_cases:
        with platform.client(token) as http:
            resp = http.post("/v1/sweeps", json=body)
        assert resp.status_code == status, resp.text
        assert [p["field"] for p in resp.json()["problems"]] == ["tenant"], resp.text
    schedule = {"name": "bad", "schedule": {"interval": "1h"}, "sweep": {**good, "tenant": "beta"}}
    with platform.client("admin-token") as http:
        resp = http.post("/v1/schedules", json={**schedule, "tenant": "alpha"})
        assert resp.status_code == 422 and [p["field"] for p in resp.json()["problems"]] == ["sweep.tenant"], resp.text
        assert http.get("/v1/sweeps", params={"tenant": "beta"}).status_code == 200
    with platform.client("alpha-token") as http:
        assert http.post("/v1/schedules", json={**schedule, "tenant": "beta"}).status_code == 403
        resp = http.get("/v1/sweeps", params={"tenant": "beta"})
        assert resp.status_code == 403 and "tenant" in resp.text, resp.text
        assert http.get("/v1/sweeps", params={"tenant": "alpha"}).status_code == 200
    with platform.client("alpha-token") as http:
        assert [s for s in http.get("/v1/sweeps").json() if s["name"] == "bad"] == []
        assert [s for s in http.get("/v1/schedules").json() if s["name"] == "bad"] == []
        resp = http.post("/v1/schedules", json={"name": "bad", "schedule": {"interval": "1s", "cron": "* * * * *"}, "sweep": good})
        assert resp.status_code == 422 and "schedule" in [p["field"] for p in resp.json()["problems"]], resp.text


SLEEPER = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(143)))\n"
    "print('trial', sys.argv[1], flush=True)\n"
    "time.sleep(120)\n"
)


@only("postgres")
def test_cancel_stops_the_running_trials_and_starts_no_more(platform: Platform) -> None:
    sweep = submit_sweep(platform, sweep_spec("cancelme", SLEEPER, parameters={"grid": {"i": list(range(6))}}))
    wait_sweep(platform, sweep["id"], lambda s: s["counts"].get("RUNNING", 0) == 2, timeout=60)
    with platform.client("alpha-token") as http:
        assert http.post(f"/v1/sweeps/{sweep['id']}/cancel").status_code == 200
    done = wait_sweep(platform, sweep["id"], lambda s: s["state"] in SWEEP_DONE, timeout=60)
    assert done["state"] == "CANCELLED", done
    states = [t["state"] for t in done["trials"]]
    assert states == ["CANCELLED", "CANCELLED", "PENDING", "PENDING", "PENDING", "PENDING"], states
    assert (done["summary"]["cancelled"], done["summary"]["not_started"]) == (2, 4)
    with platform.client("alpha-token") as http:
        for trial in done["trials"][:2]:
            assert "got SIGTERM" in http.get(f"/v1/jobs/{trial['job_id']}/logs").text, trial
    time.sleep(2.0)
    assert started_workflows(platform, f"WorkflowId STARTS_WITH '{sweep['id']}-' AND WorkflowType = 'TrainingJob'") == 2


def test_worker_killed_mid_sweep_resumes_without_duplicate_trials(platform: Platform) -> None:
    code = "import sys, time; print('trial', sys.argv[1], flush=True); time.sleep(3)"
    sweep = submit_sweep(platform, sweep_spec("survivor", code, parameters={"list": [{"i": i} for i in range(4)]}))
    # Killed mid-sweep: a trial running, and trials still to start.
    wait_sweep(platform, sweep["id"], lambda s: s["counts"].get("RUNNING", 0) >= 1 and s["counts"].get("PENDING", 0) >= 1, timeout=60)
    worker = json.loads((platform.data_dir / "pids.json").read_text())["worker"]
    os.kill(worker, signal.SIGKILL)
    done = wait_sweep(platform, sweep["id"], lambda s: s["state"] in SWEEP_DONE, timeout=120)
    assert done["state"] == "COMPLETED", done
    assert json.loads((platform.data_dir / "pids.json").read_text())["worker"] != worker
    assert [t["state"] for t in done["trials"]] == ["SUCCEEDED"] * 4
    with platform.client("alpha-token") as http:
        jobs = [j for j in http.get("/v1/jobs", params={"limit": 5000}).json() if j["name"].startswith("survivor-")]
        assert sorted(j["id"] for j in jobs) == [f"{sweep['id']}-{i:04d}" for i in range(4)]
        for j in jobs:
            detail = http.get(f"/v1/jobs/{j['id']}").json()
            assert detail["attempt"] == 1
            assert [e["kind"] for e in detail["events"]].count("LAUNCHING") == 1
    assert started_workflows(platform, f"WorkflowId STARTS_WITH '{sweep['id']}-' AND WorkflowType = 'TrainingJob'") == 4


@only("sqlite")
def test_interval_schedule_fires_sweeps_and_pause_trigger_resume_delete(platform: Platform) -> None:
    sweep = sweep_spec("ticker", "import sys; print('tick', sys.argv[1])", parameters={"list": [{"n": 1}]})
    body = {"name": "ticker", "schedule": {"interval": "3s"}, "overlap": "buffer_one", "sweep": sweep}
    with platform.client("alpha-token") as http:
        resp = http.post("/v1/schedules", json=body)
        assert resp.status_code == 201, resp.text
        schedule = resp.json()
        sid = schedule["id"]
        assert schedule["interval_s"] == [3.0] and schedule["overlap"] == "buffer_one" and not schedule["paused"]
        assert schedule["temporal_url"].endswith(f"/namespaces/default/schedules/{sid}"), schedule

        def runs() -> list[dict[str, Any]]:
            return list(http.get("/v1/sweeps", params={"schedule_id": sid}).json())

        deadline = time.monotonic() + 40
        while len([s for s in runs() if s["state"] == "COMPLETED"]) < 2:
            assert time.monotonic() < deadline, (runs(), platform.logs())
            time.sleep(0.5)
        for run in runs():
            assert run["trial_count"] == 1 and run["schedule_id"] == sid
        completed = next(s for s in runs() if s["state"] == "COMPLETED")
        [trial] = http.get(f"/v1/sweeps/{completed['id']}").json()["trials"]
        assert trial["state"] == "SUCCEEDED" and "tick 1" in http.get(f"/v1/jobs/{trial['job_id']}/logs").text

        assert http.post(f"/v1/schedules/{sid}/pause").json()["paused"] is True
        time.sleep(2.0)  # a run started just before the pause creates its sweep now
        paused_count = len(runs())
        time.sleep(7.0)
        assert len(runs()) == paused_count, "a paused schedule fired"
        # Each action of the schedule made one sweep.
        assert http.get(f"/v1/schedules/{sid}").json()["actions_taken"] == paused_count

        http.post(f"/v1/schedules/{sid}/trigger")
        deadline = time.monotonic() + 20
        while len(runs()) < paused_count + 1:
            assert time.monotonic() < deadline, "trigger did not start a sweep"
            time.sleep(0.3)

        assert http.post(f"/v1/schedules/{sid}/resume").json()["paused"] is False
        deadline = time.monotonic() + 20
        while len(runs()) < paused_count + 2:
            assert time.monotonic() < deadline, "a resumed schedule did not fire"
            time.sleep(0.3)

        with platform.client("beta-token") as other:
            assert other.get(f"/v1/schedules/{sid}").status_code == 404
            assert other.post(f"/v1/schedules/{sid}/pause").status_code == 404
            assert sid not in [s["id"] for s in other.get("/v1/schedules").json()]
        assert http.delete(f"/v1/schedules/{sid}").status_code == 204
        assert http.get(f"/v1/schedules/{sid}").status_code == 404


@only("sqlite")
def test_cli_submits_a_sweep_and_backfills_a_paused_cron_schedule(platform: Platform, tmp_path: Path) -> None:
    env = {**os.environ, "FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": "alpha-token"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)

    spec_file = tmp_path / "sweep.json"
    spec_file.write_text(
        json.dumps(sweep_spec("via-cli", "import sys; print('n', sys.argv[1])", parameters={"list": [{"n": 1}, {"n": 2}]}))
    )
    done = cli("sweep", "submit", str(spec_file), "--wait", "-o", "json")
    assert done.returncode == 0, done.stderr
    sweep = json.loads(done.stdout)
    assert sweep["state"] == "COMPLETED" and sweep["summary"]["succeeded"] == 2
    assert sweep["id"] in [s["id"] for s in json.loads(cli("sweep", "ls", "-o", "json").stdout)]
    assert [t["params"] for t in json.loads(cli("sweep", "show", sweep["id"], "-o", "json").stdout)["trials"]] == [{"n": 1}, {"n": 2}]
    # An invalid file is refused before anything is sent, naming the field.
    bad_file = tmp_path / "bad.json"
    bad_file.write_text(json.dumps({**json.loads(spec_file.read_text()), "name": "bad-cli", "max_concurrent": 0}))
    refused = cli("sweep", "submit", str(bad_file))
    assert refused.returncode != 0 and "max_concurrent" in refused.stderr, (refused.stdout, refused.stderr)
    # `sweep cancel` stops a running sweep.
    spec_file.write_text(json.dumps(sweep_spec("cli-cancel", SLEEPER, parameters={"list": [{"i": 0}, {"i": 1}, {"i": 2}]})))
    submitted = cli("sweep", "submit", str(spec_file), "-o", "json")
    assert submitted.returncode == 0, submitted.stderr
    doomed = json.loads(submitted.stdout)["sweep"]["id"]
    wait_sweep(platform, doomed, lambda s: s["counts"].get("RUNNING", 0) >= 1, timeout=60)
    cancelled = cli("sweep", "cancel", doomed)
    assert cancelled.returncode == 0 and doomed in cancelled.stdout, cancelled.stderr
    ended = wait_sweep(platform, doomed, lambda s: s["state"] in SWEEP_DONE, timeout=60)
    assert ended["state"] == "CANCELLED" and ended["summary"]["not_started"] >= 1, ended
    # A cron schedule created paused never fires by itself; a backfill over the last 3 hours starts its 3 missed hourly runs.
    sched_file = tmp_path / "schedule.json"
    body = {
        "name": "hourly",
        "schedule": {"cron": "0 * * * *"},
        "paused": True,
        "sweep": sweep_spec("hourly", "print('hourly run')", parameters={"list": [{"n": 1}]}),
    }
    sched_file.write_text(json.dumps(body))
    created = cli("schedule", "create", str(sched_file), "-o", "json")
    assert created.returncode == 0, created.stderr
    sid = json.loads(created.stdout)["id"]
    assert json.loads(cli("schedule", "ls", "-o", "json").stdout)[0]["paused"] is True
    assert cli("schedule", "backfill", sid, "--since", "3h").returncode == 0
    with platform.client("alpha-token") as http:
        deadline = time.monotonic() + 60
        while True:
            runs = http.get("/v1/sweeps", params={"schedule_id": sid}).json()
            if len(runs) >= 3 and all(r["state"] == "COMPLETED" for r in runs):
                break
            assert time.monotonic() < deadline, runs
            time.sleep(0.5)
        assert len(runs) == 3
        # `schedule trigger | resume | pause` through the CLI.
        triggered = cli("schedule", "trigger", sid, "-o", "json")
        assert triggered.returncode == 0 and json.loads(triggered.stdout)["paused"] is True, triggered.stderr
        deadline = time.monotonic() + 60
        while len(http.get("/v1/sweeps", params={"schedule_id": sid}).json()) < 4:
            assert time.monotonic() < deadline, "trigger did not start a sweep"
            time.sleep(0.3)
    resumed = cli("schedule", "resume", sid, "-o", "json")
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["paused"] is False, resumed.stderr
    paused = cli("schedule", "pause", sid, "--note", "by the test", "-o", "json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["paused"] is True and json.loads(paused.stdout)["note"] == "by the test"
    assert cli("schedule", "delete", sid).returncode == 0
    assert sid not in [s["id"] for s in json.loads(cli("schedule", "ls", "-o", "json").stdout)]


@only("postgres")
def test_overlap_skip_skips_runs_and_cancel_previous_cancels_the_running_sweep(platform: Platform) -> None:
    """Two schedules whose sweep's one trial runs until cancelled, driven by triggers (which follow the
    schedule's overlap policy): with `skip`, a run due while one is running is skipped (not buffered);
    with `cancel_previous`, it cancels the running sweep (its trial gets SIGTERM) and then runs."""
    with platform.client("alpha-token") as http:

        def runs(sid: str) -> list[dict[str, Any]]:
            return sorted(http.get("/v1/sweeps", params={"schedule_id": sid}).json(), key=lambda s: s["created_at"])

        def until(what: str, predicate: Any, timeout: float = 60.0) -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                schedules = http.get("/v1/schedules").json()
                assert time.monotonic() < deadline, f"{what}: {json.dumps(schedules, indent=1)}\n{platform.logs()}"
                time.sleep(0.3)

        def running_trial(sweep_id: str) -> bool:
            [trial] = get_sweep(platform, sweep_id)["trials"]
            return trial["state"] == "RUNNING" and "trial 0" in http.get(f"/v1/jobs/{trial['job_id']}/logs").text

        sleeper = sweep_spec("overlap", SLEEPER, parameters={"list": [{"i": 0}]})
        # skip: a second run while the first one's trial is running is skipped, not buffered.
        body = {"name": "skipper", "schedule": {"interval": "1h"}, "overlap": "skip", "paused": True, "sweep": sleeper}
        resp = http.post("/v1/schedules", json=body)
        assert resp.status_code == 201, resp.text
        skipper = resp.json()["id"]
        assert resp.json()["overlap"] == "skip"
        http.post(f"/v1/schedules/{skipper}/trigger")
        until("a first run", lambda: len(runs(skipper)) == 1)
        first = runs(skipper)[0]
        until("the first run's trial running", lambda: running_trial(first["id"]))
        http.post(f"/v1/schedules/{skipper}/trigger")
        until("a skipped run", lambda: http.get(f"/v1/schedules/{skipper}").json()["skipped_for_overlap"] == 1)
        assert http.post(f"/v1/sweeps/{first['id']}/cancel").status_code == 200
        assert wait_sweep(platform, first["id"], lambda s: s["state"] in SWEEP_DONE, timeout=60)["state"] == "CANCELLED"
        until("the first run closed", lambda: http.get(f"/v1/schedules/{skipper}").json()["running"] == [])
        assert http.get(f"/v1/schedules/{skipper}").json()["actions_taken"] == 1
        assert [s["id"] for s in runs(skipper)] == [first["id"]]
        assert http.delete(f"/v1/schedules/{skipper}").status_code == 204

        # cancel_previous: created paused, driven by triggers.
        body = {"name": "canceller", "schedule": {"interval": "1h"}, "overlap": "cancel_previous", "paused": True, "sweep": sleeper}
        resp = http.post("/v1/schedules", json=body)
        assert resp.status_code == 201, resp.text
        canceller = resp.json()["id"]
        assert resp.json()["overlap"] == "cancel_previous"
        http.post(f"/v1/schedules/{canceller}/trigger")
        until("a first run", lambda: len(runs(canceller)) == 1)
        old = runs(canceller)[0]["id"]
        until("the first run's trial running", lambda: running_trial(old))
        # Often within the same second as the first: Temporal then gives both runs one workflow id (two sweeps still).
        http.post(f"/v1/schedules/{canceller}/trigger")
        ended = wait_sweep(platform, old, lambda s: s["state"] in SWEEP_DONE, timeout=60)
        assert ended["state"] == "CANCELLED", ended
        [trial] = ended["trials"]
        assert trial["state"] == "CANCELLED" and ended["summary"]["cancelled"] == 1, ended
        assert "got SIGTERM" in http.get(f"/v1/jobs/{trial['job_id']}/logs").text
        until("the next run", lambda: len(runs(canceller)) == 2)
        new = runs(canceller)[1]["id"]
        until("the next run's trial running", lambda: running_trial(new))
        assert get_sweep(platform, new)["state"] == "RUNNING"
        assert http.delete(f"/v1/schedules/{canceller}").status_code == 204
        assert http.post(f"/v1/sweeps/{new}/cancel").status_code == 200
    assert wait_sweep(platform, new, lambda s: s["state"] in SWEEP_DONE, timeout=60)["state"] == "CANCELLED"


@only("sqlite")
def test_a_preempted_trial_resumes_from_its_own_checkpoint_and_counts_once(platform: Platform) -> None:
    """Each trial is an ordinary job: preempted, it comes back as attempt 2 from its own trial-NNNN checkpoint,
    and the sweep still has one trial for it, one TrainingJob workflow, and a right summary."""
    spec = sweep_spec("preempt-trial", "", parameters={"list": [{"lr": 0.05}, {"lr": 0.02}]}, metric={"name": "loss"})
    train = [str(REPO / "examples" / "train_numpy.py"), "--steps", "150", "--checkpoint-every", "10", "--step-seconds", "0.05"]
    spec["template"]["entrypoint"] = [sys.executable, *train, "--lr", "{{lr}}"]
    sweep = submit_sweep(platform, spec)
    trial0 = f"{sweep['id']}-0000"
    wait_sweep(platform, sweep["id"], lambda s: s["trials"][0]["state"] == "RUNNING", timeout=60)
    wait_for_checkpoint(platform, trial0)
    with platform.client("alpha-token") as http:
        answer = http.post(f"/v1/jobs/{trial0}/preempt")
    assert answer.status_code == 200 and answer.json()["accepted"], answer.text
    done = wait_sweep(platform, sweep["id"], lambda s: s["state"] in SWEEP_DONE, timeout=180)
    assert done["state"] == "COMPLETED", done
    assert [t["job_id"] for t in done["trials"]] == [trial0, f"{sweep['id']}-0001"]
    assert [t["state"] for t in done["trials"]] == ["SUCCEEDED", "SUCCEEDED"] and done["counts"] == {"SUCCEEDED": 2}, done
    preempted, other = platform.job(trial0), platform.job(f"{sweep['id']}-0001")
    assert (preempted["attempt"], other["attempt"]) == (2, 1)
    kinds = [e["kind"] for e in preempted["events"]]
    assert kinds.index("PREEMPTING") < kinds.index("REQUEUED") < kinds.index("SUCCEEDED"), kinds
    first, second = log_of(platform, trial0, 1), log_of(platform, trial0, 2)
    stopped_at = int(re.search(r"SIGTERM: checkpointed step (\d+)", first).group(1))  # type: ignore[union-attr]
    assert resumed_step(second) == stopped_at > 0
    resumed_from = re.search(r"resumed from step \d+ \((.*)\)", second).group(1)  # type: ignore[union-attr]
    assert "/preempt-trial/trial-0000/" in resumed_from, resumed_from
    assert "finished 150 steps" in second
    # Counted once: two trials started, both succeeded, and each reports the metric of its last attempt.
    summary = done["summary"]
    assert (summary["started"], summary["succeeded"], summary["failed"], summary["cancelled"]) == (2, 2, 0, 0), summary
    assert (summary["unfinished"], summary["not_started"], summary["refused"]) == (0, 0, 0), summary
    final_loss = float(re.search(r"FAIRGANG_METRIC loss=(\S+)", second).group(1))  # type: ignore[union-attr]
    assert done["trials"][0]["metrics"] == {"loss": final_loss}
    assert summary["best"] is not None and summary["best"]["index"] in (0, 1)
    assert started_workflows(platform, f"WorkflowId STARTS_WITH '{sweep['id']}-' AND WorkflowType = 'TrainingJob'") == 2
    assert started_workflows(platform, f"ParentWorkflowId = '{sweep['id']}' AND WorkflowType = 'TrainingJob'") == 2


@only("postgres")
def test_a_failing_trial_is_counted_and_fails_sweep_submit_wait(platform: Platform, tmp_path: Path) -> None:
    """A trial whose job exits non-zero is FAILED, with its exit code; the sweep's summary counts it, the others
    still run, and `fairgang sweep submit FILE --wait` exits non-zero."""
    code = "import sys; n = int(sys.argv[1]); print('trial', n, flush=True); sys.exit(3 if n == 1 else 0)"
    spec_file = tmp_path / "failing.json"
    spec_file.write_text(json.dumps(sweep_spec("one-fails", code, parameters={"list": [{"n": 0}, {"n": 1}, {"n": 2}]})))
    env = {**os.environ, "FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": "alpha-token"}
    argv = [sys.executable, "-m", "cli", "sweep", "submit", str(spec_file), "--wait", "-o", "json"]
    waited = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert waited.returncode == 1 and "Traceback" not in waited.stderr, (waited.stdout, waited.stderr)
    shown = json.loads(waited.stdout)
    assert shown["state"] in SWEEP_DONE, shown
    assert [(t["state"], t["exit_code"]) for t in shown["trials"]] == [("SUCCEEDED", 0), ("FAILED", 3), ("SUCCEEDED", 0)], shown
    summary = shown["summary"]
    assert (summary["started"], summary["succeeded"], summary["failed"], summary["not_started"]) == (3, 2, 1, 0), summary
    # The API says the same as the CLI printed.
    assert get_sweep(platform, shown["id"])["summary"] == summary


def test_a_schedule_and_a_running_sweep_survive_a_kill_9_of_the_whole_platform(platform: Platform) -> None:
    """kill -9 of `fairgang dev` mid-sweep, then a restart on the same data dir: the schedule is still there and
    fires again, and the in-flight sweep completes with exactly its trials. (It restarts the module's platform,
    so it comes last.)"""
    ticker = sweep_spec("restart-tick", "import sys; print('tick', sys.argv[1])", parameters={"list": [{"n": 1}]})
    with platform.client("alpha-token") as http:
        resp = http.post("/v1/schedules", json={"name": "restart-tick", "schedule": {"interval": "3s"}, "sweep": ticker})
        assert resp.status_code == 201, resp.text
    sid = resp.json()["id"]

    def runs() -> list[dict[str, Any]]:
        with platform.client("alpha-token") as http:
            return list(http.get("/v1/sweeps", params={"schedule_id": sid}).json())

    def until(what: str, predicate: Any, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"{what}: {runs()}\n{platform.logs()}"
            time.sleep(0.5)

    until("a first scheduled run", lambda: len(runs()) >= 1)
    code = "import sys, time; print('trial', sys.argv[1], flush=True); time.sleep(3)"
    sweep = submit_sweep(platform, sweep_spec("restarted", code, parameters={"list": [{"i": i} for i in range(4)]}))
    wait_sweep(platform, sweep["id"], lambda s: s["counts"].get("RUNNING", 0) >= 1 and s["counts"].get("PENDING", 0) >= 1, timeout=60)
    with platform.client("alpha-token") as http:
        actions_before = http.get(f"/v1/schedules/{sid}").json()["actions_taken"]
    platform.kill9()
    restarted_at = time.time()
    platform.start()

    with platform.client("alpha-token") as http:
        listed = [s for s in http.get("/v1/schedules").json() if s["id"] == sid]
        assert len(listed) == 1 and listed[0]["interval_s"] == [3.0] and not listed[0]["paused"], listed
    # It fires again: two more runs started after the restart, one of them already completed.
    until(
        "scheduled runs after the restart",
        lambda: len(after := [r for r in runs() if r["created_at"] >= restarted_at]) >= 2 and any(r["state"] == "COMPLETED" for r in after),
        timeout=90,
    )

    def actions() -> int:
        with platform.client("alpha-token") as http:
            return int(http.get(f"/v1/schedules/{sid}").json()["actions_taken"])

    # Counted by the schedule itself (a run it started just before the kill may be stored only after the restart,
    # so the runs' times alone do not tell its actions apart).
    until("two more actions of the schedule after the restart", lambda: actions() >= actions_before + 2, timeout=60)
    with platform.client("alpha-token") as http:
        assert http.delete(f"/v1/schedules/{sid}").status_code == 204

    done = wait_sweep(platform, sweep["id"], lambda s: s["state"] in SWEEP_DONE, timeout=180)
    assert done["state"] == "COMPLETED", done
    assert [t["state"] for t in done["trials"]] == ["SUCCEEDED"] * 4, done["trials"]
    assert [t["job_id"] for t in done["trials"]] == [f"{sweep['id']}-{i:04d}" for i in range(4)]
    assert (done["summary"]["started"], done["summary"]["succeeded"]) == (4, 4), done["summary"]
    with platform.client("alpha-token") as http:
        jobs = [j["id"] for j in http.get("/v1/jobs", params={"limit": 5000}).json() if j["name"].startswith("restarted-")]
    assert sorted(jobs) == [f"{sweep['id']}-{i:04d}" for i in range(4)]
    assert started_workflows(platform, f"WorkflowId STARTS_WITH '{sweep['id']}-' AND WorkflowType = 'TrainingJob'") == 4
    assert started_workflows(platform, f"ParentWorkflowId = '{sweep['id']}' AND WorkflowType = 'TrainingJob'") == 4
    # The same Sweep workflow carried on (batches of 2 starts: 2 runs), it was not started over.
    assert count_workflows(platform, f"WorkflowId = '{sweep['id']}' AND WorkflowType = 'Sweep'") == 2
