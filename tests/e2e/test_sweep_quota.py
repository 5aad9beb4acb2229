"""Each trial is an ordinary job, admitted against its tenant's quota and policy.

The whole platform (`fairgang dev`) with a tenant limited to one unfinished job: a sweep
allowing 3 trials at once still runs them one at a time, and completes. Then the tenant's policy
is tightened while a sweep runs (the store re-seeded, as `fairgang seed` does): the trials due
afterwards are refused at start time, recorded REFUSED with the reason and counted in the
summary; a scheduled run started after the change fails, naming the field.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from fairgang.cluster import ClusterConfig
from store import auth, tenants
from store.db import Database
from tests.builders import max_overlap
from tests.conftest import small_cluster
from tests.e2e.conftest import TERMINAL, Platform, only
from tests.e2e.test_sweeps import SWEEP_DONE, count_workflows, started_workflows, submit_sweep, sweep_spec, wait_sweep

pytestmark = [pytest.mark.e2e, only("sqlite")]


def alpha_cluster(**alpha: Any) -> ClusterConfig:
    """The small test cluster, its tenant alpha allowed one unfinished job at a time (and ``alpha`` changes)."""
    cluster = small_cluster()
    [tenant] = [t for t in cluster.tenants if t.name == "alpha"]
    tenant.max_concurrent_jobs = 1
    for key, value in alpha.items():
        setattr(tenant, key, value)
    return cluster


def set_policy(p: Platform, cluster: ClusterConfig) -> None:
    """Change the tenants' policy in the running platform's store (what `fairgang seed` does)."""

    async def seed() -> None:
        db = Database(p.store_url)
        try:
            await tenants.seed_cluster(db, cluster)
        finally:
            await db.dispose()

    # As `fairgang seed` must: with the platform's token key (the digests it stores are keyed).
    key = (p.data_dir / "credentials" / "token.key").read_text().strip()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FAIRGANG_TOKEN_KEY", key)
        auth.reset_token_key()
        asyncio.run(seed())
    auth.reset_token_key()


@pytest.fixture(scope="module")
def capped(platform_factory: Any) -> Platform:
    p: Platform = platform_factory(alpha_cluster())
    p.start()
    return p


def test_trials_of_a_tenant_limited_to_one_job_run_one_at_a_time_and_all_succeed(capped: Platform) -> None:
    code = "import sys, time; print('trial', sys.argv[1], flush=True); time.sleep(1)"
    sweep = submit_sweep(capped, sweep_spec("one-at-a-time", code, parameters={"list": [{"i": i} for i in range(3)]}, cap=3))
    assert (sweep["max_concurrent"], sweep["trial_count"]) == (3, 3)
    seen: list[dict[str, int]] = []

    def ended(s: dict[str, Any]) -> bool:
        seen.append(s["counts"])
        return s["state"] in SWEEP_DONE

    done = wait_sweep(capped, sweep["id"], ended, timeout=180)
    assert done["state"] == "COMPLETED", done
    trials = done["trials"]
    assert [t["state"] for t in trials] == ["SUCCEEDED"] * 3, trials
    assert [t["job_id"] for t in trials] == [f"{sweep['id']}-{i:04d}" for i in range(3)]
    # One at a time: no two trials' jobs unfinished (let alone running) at once; each was created only
    # once the one before it had finished.
    assert max_overlap([(t["created_at"], t["finished_at"]) for t in trials]) == 1, trials
    assert max_overlap([(t["started_at"], t["finished_at"]) for t in trials]) == 1, trials
    for before, after in itertools.pairwise(trials):
        assert after["created_at"] >= before["finished_at"], (before, after)
    # Nor, whenever the sweep was looked at, more than one trial's job that had not ended (the others PENDING).
    assert all(sum(n for state, n in counts.items() if state not in TERMINAL | {"PENDING"}) <= 1 for counts in seen), seen
    summary = done["summary"]
    assert (summary["started"], summary["succeeded"], summary["refused"], summary["not_started"]) == (3, 3, 0, 0), summary
    assert started_workflows(capped, f"WorkflowId STARTS_WITH '{sweep['id']}-' AND WorkflowType = 'TrainingJob'") == 3


def test_trials_refused_at_start_time_after_a_policy_change_are_recorded_refused_and_counted(capped: Platform, tmp_path: Path) -> None:
    """Trial 0 runs until told to end; meanwhile the tenant's longest runtime drops below the template's
    10m. Trials 1 and 2 (held back by the job cap until then) are refused when they are due: no job, the
    reason names the field and the limit, the summary counts them, and the sweep still completes."""
    go = tmp_path / "go"
    code = f"import os, sys, time\nprint('trial', sys.argv[1], flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.1)\n"
    sweep = submit_sweep(capped, sweep_spec("policy-change", code, parameters={"list": [{"i": i} for i in range(3)]}, cap=3))
    wait_sweep(capped, sweep["id"], lambda s: s["trials"][0]["state"] == "RUNNING", timeout=60)
    set_policy(capped, alpha_cluster(max_runtime=300.0))
    try:
        go.touch()
        done = wait_sweep(capped, sweep["id"], lambda s: s["state"] in SWEEP_DONE, timeout=120)
    finally:
        set_policy(capped, alpha_cluster())
    assert done["state"] == "COMPLETED", done
    trials = done["trials"]
    assert [t["state"] for t in trials] == ["SUCCEEDED", "REFUSED", "REFUSED"], trials
    for trial in trials[1:]:
        assert trial["job_id"] is None, trial
        assert "max_runtime" in trial["reason"] and "limit of 5m" in trial["reason"], trial
    summary = done["summary"]
    assert (summary["started"], summary["succeeded"], summary["refused"]) == (3, 1, 2), summary
    assert (summary["failed"], summary["cancelled"], summary["unfinished"], summary["not_started"]) == (0, 0, 0, 0), summary
    with capped.client("alpha-token") as http:
        for index in (1, 2):
            assert http.get(f"/v1/jobs/{sweep['id']}-{index:04d}").status_code == 404
    assert started_workflows(capped, f"WorkflowId STARTS_WITH '{sweep['id']}-' AND WorkflowType = 'TrainingJob'") == 1


def test_a_scheduled_run_after_the_tenants_policy_changed_fails_naming_the_field(capped: Platform) -> None:
    """The schedule was admitted when created; its run, started after the tenant's longest runtime dropped
    below the template's, is refused at run time: the run's sweep is FAILED with the reason, and no trial runs."""
    spec = sweep_spec("tightened", "print('never')", parameters={"list": [{"n": 1}]})
    with capped.client("alpha-token") as http:
        resp = http.post("/v1/schedules", json={"name": "tightened", "schedule": {"interval": "1h"}, "paused": True, "sweep": spec})
        assert resp.status_code == 201, resp.text
        sid = resp.json()["id"]
        set_policy(capped, alpha_cluster(max_runtime=300.0))
        try:
            http.post(f"/v1/schedules/{sid}/trigger")
            deadline = time.monotonic() + 60
            while not (runs := http.get("/v1/sweeps", params={"schedule_id": sid}).json()) or runs[0]["state"] not in SWEEP_DONE:
                assert time.monotonic() < deadline, runs
                time.sleep(0.3)
        finally:
            set_policy(capped, alpha_cluster())
            assert http.delete(f"/v1/schedules/{sid}").status_code == 204
        [run] = runs
        assert run["state"] == "FAILED", run
        assert "template.max_runtime" in run["reason"] and "limit of 5m" in run["reason"], run
        assert run["trial_count"] == 0 and http.get(f"/v1/sweeps/{run['id']}").json()["trials"] == []
    assert count_workflows(capped, f"WorkflowId STARTS_WITH '{run['id']}-'") == 0
