"""Cancel and preempt latency on the real platform, at toy scale.

Starts ``fairgang dev`` (Temporal's dev server, the store, the API, the placement service, the workflow
worker, one simulated agent) with the platform's default timings (activity heartbeat timeout 20 s), then,
one job at a time, ``--tries`` times each:

- **cancel, sleep**: a member that is ``sleep`` under a bash trap recording when SIGTERM came (the trap
  exits at once); grace 2 s. Measures cancel -> SIGTERM at the member and cancel -> CANCELLED.
- **cancel, ignores TERM**: the same with a member that records SIGTERM and then keeps running; its
  end is the SIGKILL one grace period (2 s) after the SIGTERM. Measures cancel -> SIGTERM, cancel ->
  CANCELLED and SIGTERM -> CANCELLED (never under the grace period).
- **preempt**: the API's preempt (the workflow's update) of a running ``sleep`` member with a 10 s grace;
  measures preempt -> PREEMPTING recorded and preempt -> SIGTERM at the member.

Each try waits a random 0-3 s after the member started, so the request lands anywhere in the launch
activity's heartbeat cycle. Times: the request's send time (this process's wall clock), the member's
``$EPOCHREALTIME`` at its SIGTERM trap, and the store's event times (same machine, same clock).
Also prints the CPU time the platform's processes used during the measurement.

Run: ``.venv/bin/python -m benchmarks.signal_bench`` (``--help`` for options; ``DATABASE_URL`` picks
PostgreSQL, SQLite otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.table import Table

from benchmarks.ports import free_port

REPO = Path(__file__).resolve().parents[1]
TOKEN, ADMIN = "alpha-token", "admin-token"

CLUSTER = {
    "admin_tokens": [ADMIN],
    "node_token": "node-token",
    "tenants": [
        {
            "name": "alpha",
            "tokens": [TOKEN],
            "quotas": {"H100-80GB": {"nominal": 8}},
            "max_gpus_per_job": 8,
            "max_runtime": "24h",
            "checkpoint_prefix": "/ckpt/alpha",
        }
    ],
    "nodes": [{"id": "h1", "gpu_type": "H100-80GB", "gpus": 8, "labels": {"leaf": "l1", "spine": "s1"}}],
}

#: $1: a directory. Writes started-<attempt>, then term-<attempt> at SIGTERM (wall time, µs), then exits
#: (mode "exit") or keeps running until SIGKILLed (mode "ignore": the SIGTERM kills only its `sleep`).
MEMBER = r"""
d=$1; a=$FAIRGANG_ATTEMPT
if [ "$2" = exit ]; then trap 'echo $EPOCHREALTIME > "$d/term-$a"; exit 143' TERM
else trap 'echo $EPOCHREALTIME > "$d/term-$a"' TERM; fi
echo $EPOCHREALTIME > "$d/started-$a"
while :; do sleep 600 & wait $!; done
"""


class Dev:
    """A `fairgang dev` in a temporary directory."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.api_port, temporal_port, ui_port = free_port(), free_port(), free_port()
        data_dir.mkdir(parents=True, exist_ok=True)
        config = data_dir / "cluster.yaml"
        config.write_text(yaml.safe_dump(CLUSTER))
        argv = [sys.executable, "-m", "cli", "dev", "--config", str(config), "--data-dir", str(data_dir)]
        argv += ["--api-port", str(self.api_port), "--temporal-port", str(temporal_port), "--ui-port", str(ui_port)]
        self.log = data_dir / "dev.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while b"ready:" not in self.log.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fairgang dev did not start:\n{self.log.read_text()}")
            time.sleep(0.3)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.api_port}", timeout=30)

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def call(self, method: str, path: str, token: str = TOKEN, **kw: Any) -> Any:
        resp = self.http.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)
        resp.raise_for_status()
        return resp.json()

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.call("GET", f"/v1/jobs/{job_id}", ADMIN))

    def cpu_s(self) -> dict[str, float]:
        """CPU time (user + system) of each part so far."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, pid in json.loads((self.data_dir / "pids.json").read_text()).items():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        return out


def wait_until(what: str, predicate: Any, timeout: float = 120.0, every: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(every)


def read_time(path: Path) -> float | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return float(text) if text else None


def event_ts(job: dict[str, Any], kind: str, attempt: int = 1) -> float:
    return float(next(e["ts"] for e in job["events"] if e["kind"] == kind and e["attempt"] == attempt))


def run_member(dev: Dev, work: Path, name: str, mode: str, grace: str) -> tuple[str, Path]:
    d = work / name
    d.mkdir()
    spec = {
        "name": name,
        "entrypoint": ["bash", "-c", MEMBER, "member", str(d), mode],
        "gpu_type": "H100-80GB",
        "gpu_count": 1,
        "max_runtime": "1h",
        "checkpoint_dir": f"/ckpt/alpha/{name}",
        "grace_period": grace,
    }
    job_id = dev.call("POST", "/v1/jobs", json=spec)["job"]["id"]
    wait_until(f"{name} started", lambda: (d / "started-1").exists() and dev.job(job_id)["state"] == "RUNNING", every=0.1)
    time.sleep(random.uniform(0.0, 3.0))
    return job_id, d


def cancel_try(dev: Dev, work: Path, name: str, mode: str) -> dict[str, float]:
    job_id, d = run_member(dev, work, name, mode, "2s")
    sent = time.time()
    dev.call("POST", f"/v1/jobs/{job_id}/cancel")
    term = wait_until("SIGTERM", lambda: read_time(d / "term-1"), every=0.005)
    done = wait_until("CANCELLED", lambda: (j := dev.job(job_id))["state"] == "CANCELLED" and j, every=0.05)
    end = event_ts(done, "CANCELLED")
    return {"to_term": term - sent, "to_end": end - sent, "term_to_end": end - term}


def preempt_try(dev: Dev, work: Path, name: str) -> dict[str, float]:
    job_id, d = run_member(dev, work, name, "exit", "10s")
    sent = time.time()
    dev.call("POST", f"/v1/jobs/{job_id}/preempt")
    term = wait_until("SIGTERM", lambda: read_time(d / "term-1"), every=0.005)
    job = wait_until("PREEMPTING", lambda: (j := dev.job(job_id))["events"] and any(e["kind"] == "PREEMPTING" for e in j["events"]) and j)
    preempting = event_ts(job, "PREEMPTING")
    # Clean up: the job queues again; cancel it (whatever attempt runs) and wait for its end.
    dev.call("POST", f"/v1/jobs/{job_id}/cancel")
    wait_until("preempted job cancelled", lambda: dev.job(job_id)["state"] == "CANCELLED", every=0.1)
    return {"to_preempting": preempting - sent, "to_term": term - sent}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the platform's data directory")
    args = parser.parse_args()
    random.seed(args.seed)
    console = Console(width=150)
    work = Path(tempfile.mkdtemp(prefix="signal-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRGANG_")}
    dev = Dev(work / "dev", env)
    rows: dict[str, list[dict[str, float]]] = {"sleep": [], "ignore": [], "preempt": []}
    try:
        cpu0, t0 = dev.cpu_s(), time.monotonic()
        for i in range(args.tries):
            rows["sleep"].append(cancel_try(dev, work, f"cancel-sleep-{i}", "exit"))
            rows["ignore"].append(cancel_try(dev, work, f"cancel-ignore-{i}", "ignore"))
            rows["preempt"].append(preempt_try(dev, work, f"preempt-{i}"))
            console.print(
                f"try {i + 1}/{args.tries}: " + json.dumps({k: {m: round(v, 3) for m, v in r[-1].items()} for k, r in rows.items()})
            )
        cpu1, wall = dev.cpu_s(), time.monotonic() - t0
    finally:
        dev.stop()
    table = Table(title=f"Cancel and preempt latency ({args.tries} tries each, grace 2 s / preempt 10 s)")
    for col in ("measurement", "p50 (s)", "p99 (s)", "min (s)", "max (s)"):
        table.add_column(col, justify="right" if col != "measurement" else "left")
    labels = [
        ("sleep", "to_term", "cancel -> SIGTERM at member (sleep)"),
        ("sleep", "to_end", "cancel -> CANCELLED (sleep, grace 2 s)"),
        ("ignore", "to_term", "cancel -> SIGTERM at member (ignores TERM)"),
        ("ignore", "to_end", "cancel -> CANCELLED (ignores TERM, grace 2 s)"),
        ("ignore", "term_to_end", "SIGTERM -> CANCELLED (ignores TERM, grace 2 s)"),
        ("preempt", "to_preempting", "preempt -> PREEMPTING recorded"),
        ("preempt", "to_term", "preempt -> SIGTERM at member (sleep)"),
    ]
    for kind, key, label in labels:
        values = [r[key] for r in rows[kind]]
        table.add_row(label, f"{statistics.median(values):.3f}", f"{pct(values, 0.99):.3f}", f"{min(values):.3f}", f"{max(values):.3f}")
    console.print(table)
    used = {name: cpu1.get(name, 0.0) - cpu0.get(name, 0.0) for name in cpu1}
    console.print(
        f"platform CPU over {wall:.0f} s of measurement: {sum(used.values()):.1f} s ("
        + ", ".join(f"{n} {v:.1f}" for n, v in sorted(used.items(), key=lambda kv: -kv[1]))
        + ")"
    )
    if not args.keep:
        subprocess.run(["rm", "-rf", str(work)], check=False)
    else:
        console.print(f"data kept in {work}")


if __name__ == "__main__":
    main()
