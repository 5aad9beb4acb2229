"""GPU health on the real platform: a fatal fault moves the job and keeps the GPU out; cordon and drain (SPEC R6.1, R9.1)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import REPO, TERMINAL, Platform, only
from tests.e2e.test_lifecycle import training_spec, wait_for_checkpoint

# The health policy and its store changes are tested on both backends in tests/api and tests/store.
pytestmark = [pytest.mark.e2e, only("postgres")]


def cli(platform: Platform, *args: str, token: str = "admin-token") -> str:
    env = {"FAIRGANG_API_URL": platform.api_url, "FAIRGANG_TOKEN": token, "COLUMNS": "250", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def gpus_of(job: dict[str, Any]) -> set[tuple[str, int]]:
    return {(m["node_id"], i) for m in job["allocation"]["members"] for i in m["gpu_indices"]}


def node(platform: Platform, node_id: str) -> dict[str, Any]:
    with platform.client("admin-token") as http:
        return next(n for n in http.get("/v1/fleet").json()["nodes"] if n["id"] == node_id)


def metric(platform: Platform, name: str, **labels: str) -> float:
    with platform.client("admin-token") as http:
        text = http.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def test_a_fatal_xid_moves_the_job_and_keeps_the_gpu_out_until_returned(platform: Platform) -> None:
    job = platform.submit(training_spec("xid-victim", steps=600))
    running = wait_for_checkpoint(platform, job["id"])
    (node_id, index), *_ = sorted(gpus_of(running))
    cli(platform, "node", "inject-fault", node_id, str(index), "xid", "--xid", "79")

    done = platform.wait_for(job["id"], TERMINAL, timeout=240)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done
    assert any(e["kind"] == "PREEMPTING" and "Xid 79" in e["message"] for e in done["events"]), done["events"]
    assert (node_id, index) not in gpus_of(done)
    assert any(g["index"] == index and not g["healthy"] for g in node(platform, node_id)["gpu_health"])
    with platform.client("alpha-token") as http:
        events = http.get("/v1/health/events").json()
    assert any(e["kind"] == "xid" and e["node_id"] == node_id and e["gpu_index"] == index for e in events), events
    assert metric(platform, "fairgang_health_events_total", kind="xid") >= 1
    assert metric(platform, "fairgang_requeues_total", reason="health") >= 1

    cli(platform, "node", "return-gpu", node_id, str(index))
    assert node(platform, node_id)["gpus"]["unhealthy"] == 0
    time.sleep(2.5)  # heartbeats after the return report a clean GPU again
    assert node(platform, node_id)["gpus"]["unhealthy"] == 0


def test_cordon_holds_new_work_back_and_drain_checkpoints_jobs_off(platform: Platform) -> None:
    for node_id in ("h1", "h2"):
        cli(platform, "node", "cordon", node_id)
    job = platform.submit(training_spec("cordoned", steps=400))
    time.sleep(3)
    assert platform.job(job["id"])["state"] == "QUEUED"
    queue = cli(platform, "queue", token="alpha-token")
    assert job["id"] in queue and "EST. START" in queue

    cli(platform, "node", "uncordon", "h2")
    running = wait_for_checkpoint(platform, job["id"])
    assert {n for n, _ in gpus_of(running)} == {"h2"}
    cli(platform, "node", "uncordon", "h1")
    drained = cli(platform, "node", "drain", "h2", "--checkpoint")
    assert job["id"] in drained

    done = platform.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done
    assert {n for n, _ in gpus_of(done)} == {"h1"}
    assert node(platform, "h2")["state"] == "CORDONED"
    cli(platform, "node", "uncordon", "h2")
    assert node(platform, "h2")["state"] == "READY"

    fleet = cli(platform, "fleet", token="alpha-token")
    assert "l1" in fleet and "H100-80GB" in fleet
    tenants = cli(platform, "tenants", token="alpha-token")
    assert "alpha" in tenants and "beta" not in tenants
    assert "Queue" in cli(platform, "top")


def test_thermal_throttling_cordons_the_node_and_moves_a_gang_at_its_next_checkpoint(platform: Platform) -> None:
    job = platform.submit(training_spec("hot-gang", steps=400, every=10, gpu_count=16))
    wait_for_checkpoint(platform, job["id"])
    cli(platform, "node", "inject-fault", "h1", "0", "thermal")
    deadline = time.monotonic() + 60
    while node(platform, "h1")["state"] != "CORDONED":
        assert time.monotonic() < deadline, node(platform, "h1")
        time.sleep(0.5)
    # The gang is not killed at once: it is preempted after a checkpoint newer than the cordon.
    deadline = time.monotonic() + 90
    while True:
        detail = platform.job(job["id"])
        moved = [e for e in detail["events"] if e["kind"] == "PREEMPTING" and "degraded" in e["message"]]
        if moved:
            break
        assert time.monotonic() < deadline, detail["events"]
        time.sleep(0.5)
    with platform.client("admin-token") as http:
        cordons = [e for e in http.get("/v1/health/events").json() if e["node_id"] == "h1" and "cordoned" in e["message"]]
    cordoned_at = min(e["ts"] for e in cordons)
    assert any(e["kind"] == "CHECKPOINT" and cordoned_at <= e["ts"] <= moved[0]["ts"] for e in detail["events"]), detail["events"]
    # With h1 cordoned the 16-GPU gang cannot come back until an admin returns the node.
    waiting = platform.wait_for(job["id"], {"QUEUED"}, timeout=60)
    assert waiting["attempt"] == 2 and waiting["pending_reason"]
    cli(platform, "node", "return-gpu", "h1", "0")
    cli(platform, "node", "uncordon", "h1")
    done = platform.wait_for(job["id"], TERMINAL, timeout=150)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done


def test_drain_without_checkpoint_lets_running_jobs_finish_and_takes_no_new_work(platform: Platform) -> None:
    # Long enough (about 15 s) to be still running when the drain comes, however loaded the machine.
    job = platform.submit(training_spec("finishes-on-drained", steps=300, every=100, gpu_count=8))
    running = platform.wait_for(job["id"], {"RUNNING"}, timeout=60)
    [node_id] = {n for n, _ in gpus_of(running)}
    assert job["id"] in cli(platform, "node", "drain", node_id)
    done = platform.wait_for(job["id"], TERMINAL, timeout=90)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 1, done
    assert node(platform, node_id)["state"] == "CORDONED" and not node(platform, node_id)["schedulable"]
    cli(platform, "node", "uncordon", node_id)
