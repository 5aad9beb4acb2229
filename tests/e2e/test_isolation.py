"""Tenants cannot reach each other or the platform through a job (SPEC R8.4), on the real platform (`fairgang dev`,
SQLite): a hostile tenant's job tries what a job could do on a node before isolation — read the agent's and the
API's environment, the node credential, the store and Temporal's history, another tenant's log and checkpoint,
kill the agent — and every attempt fails, while the job still writes its own checkpoint. And tokens through the
CLI: a tenant admin makes, lists and revokes its tenant's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import REPO, TERMINAL, Platform, job_spec
from tests.e2e.test_health import cli
from tests.worker_agent.test_isolation import ATTACKER, ATTACKS, reachable_python

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(__import__("os").geteuid() != 0, reason="isolation needs an agent run as root")]


@pytest.fixture(scope="module")
def platform() -> Iterator[Platform]:
    # Its data dir where another uid may pass (pytest's own tmp folders are closed to other users).
    data_dir = Path(tempfile.mkdtemp(prefix="fairgang-e2e-isolation-"))
    p = Platform(data_dir, None)
    p.extra_env["FAIRGANG_ISOLATE_MEMBERS"] = "true"
    p.start()
    yield p
    p.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


def log_text(platform: Platform, job_id: str) -> str:
    with platform.client("admin-token") as http:
        return http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 1, "rank": 0}).text


def test_a_hostile_job_reaches_neither_the_platform_nor_another_tenant(platform: Platform) -> None:
    python = reachable_python()
    secret = "print('beta-secret'); import os; open(os.environ['CHECKPOINT_DIR'] + '/weights', 'w').write('beta weights')"
    beta = platform.submit(
        {**job_spec("beta-secret", secret, checkpoint_dir="/ckpt/beta/secret"), "entrypoint": [python, "-I", "-c", secret]},
        token="beta-token",
    )
    done = platform.wait_for(beta["id"], TERMINAL, timeout=90)
    assert done["state"] == "SUCCEEDED", done
    pids = json.loads((platform.data_dir / "pids.json").read_text())
    targets: dict[str, Any] = {
        "agent_pid": pids["agent-h1"],
        "token_file": str(platform.data_dir / "credentials" / "h1.token"),
        "state_dir": str(platform.data_dir / "agent-state"),
        "other_log": str(platform.data_dir / "logs" / beta["id"] / "attempt-1-rank-0.log"),
        "other_checkpoint": str(platform.data_dir / "checkpoints" / "ckpt" / "beta" / "secret" / "weights"),
        "store": str(platform.data_dir / "fairgang.db"),
        "more": [
            f"/proc/{pids['api']}/environ",
            f"/proc/{pids['scheduler']}/environ",
            str(platform.data_dir / "temporal.db"),
            str(platform.data_dir / "process-logs" / "api.log"),
        ],
    }
    assert all(Path(t).exists() for t in [*targets["more"], *(v for k, v in targets.items() if k not in ("agent_pid", "more"))])
    attacker = job_spec("attacker", "", checkpoint_dir="/ckpt/alpha/attacker")
    attacker["entrypoint"] = [python, "-I", "-c", ATTACKER, json.dumps(targets)]
    job = platform.submit(attacker)
    done = platform.wait_for(job["id"], TERMINAL, timeout=90)
    assert done["state"] == "SUCCEEDED", done
    [line] = [x for x in log_text(platform, job["id"]).splitlines() if x.startswith("VERDICT ")]
    got = json.loads(line.removeprefix("VERDICT "))
    assert got["uid"] != 0 and got["groups"] == [], got
    attacks = [*ATTACKS, *(f"read {path}" for path in targets["more"])]
    assert not [name for name in attacks if got[name] == "succeeded"], got
    assert got["write its own checkpoint"] == "succeeded", got


def test_a_job_pointed_at_another_tenants_checkpoints_is_refused(platform: Platform) -> None:
    """Each tenant keeps its checkpoints under its own prefix (/checkpoints/<tenant> where none is configured)."""
    with platform.client("beta-token") as http:
        resp = http.post("/v1/jobs", json=job_spec("thief", "pass", checkpoint_dir="/ckpt/alpha/attacker"))
    assert resp.status_code == 422, resp.text
    assert "checkpoint_dir" in resp.text and "/ckpt/beta" in resp.text


def test_tokens_through_the_cli_a_tenant_admin_makes_one_a_member_uses_it_and_its_revocation_locks_it_out(platform: Platform) -> None:
    made = cli(platform, "token", "create", "ci-runner", "--expires", "30d", token="alpha-admin-token")
    token_id, secret = made.split()[1], made.strip().splitlines()[-1]
    assert "tenant, alpha" in made and secret.startswith("fgt-")
    assert "Queue" in cli(platform, "queue", token=secret)  # it works at once, as a member of alpha
    listed = cli(platform, "token", "ls", "-o", "json", token="alpha-admin-token")
    [row] = [t for t in json.loads(listed) if str(t["id"]) == token_id]
    assert row["name"] == "ci-runner" and row["expires_at"] is not None and row["revoked_at"] is None
    assert "ci-runner" in cli(platform, "token", "ls", token="admin-token")
    assert f"token {token_id} revoked" in cli(platform, "token", "revoke", token_id, token="alpha-admin-token")
    refused = subprocess.run(
        [sys.executable, "-m", "cli", "queue"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": secret, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert refused.returncode != 0 and "401" in refused.stdout + refused.stderr
    # A member may not make one.
    member = subprocess.run(
        [sys.executable, "-m", "cli", "token", "create", "x"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": "alpha-token", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert member.returncode != 0 and "403" in member.stdout + member.stderr


def test_an_admin_changes_a_tenant_through_the_cli_and_reads_it_in_the_audit_log(platform: Platform) -> None:
    out = cli(platform, "tenant", "set", "beta", "--weight", "2", "--quota", "H100-80GB=6:2", "--max-jobs", "50")
    assert "beta: weight 1.0 -> 2.0" in out and "beta: max_concurrent_jobs 100 -> 50" in out, out
    log = json.loads(cli(platform, "audit", "--target", "tenant:beta", "-o", "json"))
    update = next(e for e in log if e["action"] == "tenant.update")
    assert update["actor"].startswith("admin:platform#") and update["after"]["quotas"]["H100-80GB"]["nominal"] == 6
    assert "tenant.update" in cli(platform, "audit", "--limit", "5")
    bad = subprocess.run(
        [sys.executable, "-m", "cli", "tenant", "set", "beta", "--quota", "TPU=4"], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": "admin-token", "COLUMNS": "250", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert bad.returncode != 0 and "quotas.TPU" in bad.stdout + bad.stderr and "unknown GPU type" in bad.stdout + bad.stderr
