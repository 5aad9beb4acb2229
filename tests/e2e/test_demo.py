"""`make demo` for real: `fairgang dev --demo` on examples/cluster.yaml, its example jobs and sweep, and Ctrl-C.

Real Temporal dev server, real store, real API, worker, placement service and simulated agents, with the
settings a user gets (no test tuning): only the ports and the data dir differ from the Makefile's command.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fairgang.cluster import load_cluster_config
from fairgang.spec import load_spec_text
from fairgang.sweeps import load_sweep_text
from tests.conftest import drop_pg_database
from tests.e2e.conftest import REPO, _database_for, free_port
from worker_agent.launch import pid_alive

pytestmark = pytest.mark.e2e
CLUSTER = REPO / "examples" / "cluster.yaml"


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("backend", ["sqlite"])  # `make demo` runs on the embedded store
def test_make_demo_runs_the_example_jobs_and_sweep_to_the_end_and_ctrl_c_stops_it(backend: str, tmp_path: Path) -> None:
    cluster = load_cluster_config(CLUSTER)
    admin = (cluster.admin_tokens or [""])[0]
    examples = {spec.name: spec for spec in (load_spec_text(p.read_text()) for p in sorted((REPO / "examples" / "jobs").glob("*.yaml")))}
    example_sweep = load_sweep_text((REPO / "examples" / "sweeps" / "lr-features.yaml").read_text())
    assert len(examples) >= 3

    database_url = _database_for(backend)
    api_port, temporal_port, ui_port = free_port(), free_port(), free_port()
    api, ui = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{ui_port}"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("FAIRGANG_")}
    if database_url:
        env["DATABASE_URL"] = database_url
    # The Makefile's `demo` command, on free ports and a temporary data dir; run from the repository root as
    # `make demo` is (the demo reads examples/ from there). Its own session, so that Ctrl-C goes to it as a
    # terminal sends it: to the foreground process group.
    argv = [sys.executable, "-m", "cli", "dev", "--config", "examples/cluster.yaml", "--data-dir", str(tmp_path), "--demo"]
    argv += ["--api-port", str(api_port), "--temporal-port", str(temporal_port), "--ui-port", str(ui_port)]
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def output() -> str:
        text = log.read_text(errors="replace")
        for path in sorted((tmp_path / "process-logs").glob("*.log")):
            if path.name != "temporal.log":
                text += f"\n--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-30:])
        return text

    try:
        # The demo ends its show with the addresses (after the jobs and the sweep), then keeps running.
        deadline = time.monotonic() + 240
        while "Temporal UI" not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"fairgang dev --demo exited {proc.returncode}:\n{output()}"
            assert time.monotonic() < deadline, f"the demo did not get to its addresses:\n{output()}"
            time.sleep(0.5)
        time.sleep(1.0)  # the rest of that line and the next
        printed = log.read_text(errors="replace")
        words = " ".join(printed.split())  # as printed, whatever the width it was wrapped to
        assert f"API {api} docs {api}/docs Temporal UI {ui}" in words, printed
        assert proc.poll() is None, f"the demo must keep running until Ctrl-C:\n{output()}"

        with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {admin}"}, timeout=30) as http:
            # Every example job, submitted once under its own tenant, SUCCEEDED; the ids are the ones the demo printed.
            submitted = dict(re.findall(r"submitted (\S+\.yaml) as (j-\w+) \(", printed))
            assert sorted(submitted) == sorted(p.name for p in (REPO / "examples" / "jobs").glob("*.yaml")), printed
            jobs = [j for j in http.get("/v1/jobs", params={"limit": 5000}).json() if j["name"] in examples]
            assert sorted(j["name"] for j in jobs) == sorted(examples), jobs
            assert sorted(j["id"] for j in jobs) == sorted(submitted.values()), (jobs, submitted)
            for job in jobs:
                detail = http.get(f"/v1/jobs/{job['id']}").json()
                assert detail["state"] == "SUCCEEDED" and detail["exit_code"] == 0, json.dumps(detail, indent=1)
                assert detail["tenant"] == examples[job["name"]].tenant, detail
            assert len({j["tenant"] for j in jobs}) >= 3, jobs

            # The example sweep: a 3 x 2 grid, cap 2, every trial SUCCEEDED, and a best trial by its loss.
            [listed] = [s for s in http.get("/v1/sweeps").json() if s["name"] == example_sweep.name]
            assert listed["tenant"] == example_sweep.tenant and listed["max_concurrent"] == 2, listed
            sweep = http.get(f"/v1/sweeps/{listed['id']}").json()
            assert sweep["state"] == "COMPLETED" and sweep["trial_count"] == 6, json.dumps(sweep, indent=1)
            trials = sweep["trials"]
            assert [t["state"] for t in trials] == ["SUCCEEDED"] * 6, trials
            grid = example_sweep.model_dump(mode="json", by_alias=True)["parameters"]["grid"]
            assert [t["params"] for t in trials] == [dict(zip(grid, v, strict=True)) for v in itertools.product(*grid.values())]
            summary = sweep["summary"]
            assert (summary["started"], summary["succeeded"], summary["failed"], summary["not_started"]) == (6, 6, 0, 0), summary
            best = summary["best"]
            assert best is not None and best["metric"] == "loss" and best["goal"] == "minimize", summary
            assert best["value"] == trials[best["index"]]["metrics"]["loss"] == min(t["metrics"]["loss"] for t in trials), trials
            assert f"best trial #{best['index']} ({best['job_id']}): loss=" in words, printed

            # The printed addresses answer.
            assert http.get("/docs").status_code == 200
        assert httpx.get(ui, timeout=30, follow_redirects=True).status_code == 200

        # Ctrl-C: `fairgang dev` stops its parts and exits 0, and nothing of the platform is left.
        parts: dict[str, int] = json.loads((tmp_path / "pids.json").read_text())
        assert {"temporal", "api", "worker", "scheduler"} <= set(parts) and all(pid_alive(pid) for pid in parts.values()), parts
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(90) == 0, output()
        assert "stopping ..." in log.read_text(errors="replace")
        assert [name for name, pid in parts.items() if pid_alive(pid)] == [], output()
        assert [port for port in (api_port, temporal_port, ui_port) if _listening(port)] == []
    finally:
        if proc.poll() is None:
            proc.kill()  # its parts die with it (PR_SET_PDEATHSIG)
            proc.wait()
        if database_url:
            asyncio.run(drop_pg_database(database_url))
