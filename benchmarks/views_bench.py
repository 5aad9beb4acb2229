"""The API's heavy views under load: several dashboard tabs and scrapers at once, while a cheap endpoint is timed.

Starts the real API (uvicorn, one process, Temporal not needed) on an existing store, for
example one built by ``benchmarks/scale_store.py``, then for ``--duration`` seconds:

- ``--tabs`` clients per view poll ``/v1/queue``, ``/v1/tenants``, ``/v1/fleet`` and ``/metrics``
  back to back (each waits ``--pause`` seconds between requests), as that many dashboard tabs
  and scrapers would, some with the admin's token and some with tenants' tokens;
- one client times the cheap endpoints ``GET /v1/jobs/{id}`` (a running and a queued job) every 0.1 s;
- every ``--change-every`` seconds a node is cordoned or uncordoned through the API, so the
  store's version moves and the views are recomputed as in a live platform.

It prints, per endpoint, the cold latency (the first answer after the start, which waits for
the view's first computation), then over the load the number of answers, p50, p99 and the worst
latency, the CPU seconds and peak RSS of the API process and of its view worker process, the
CPU seconds of the clients (this process) and the machine's load average at the start and the end::

    .venv/bin/python -m benchmarks.scale_store --url sqlite:////tmp/scale/fairgang.db --scale 1
    .venv/bin/python -m benchmarks.views_bench --url sqlite:////tmp/scale/fairgang.db --tokens /tmp/scale/tokens.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.ports import free_port

VIEWS = ("/v1/queue", "/v1/tenants", "/v1/fleet", "/metrics")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    """The process's child processes (its view worker)."""
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class Timings:
    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.first: dict[str, float] = {}
        self.errors: dict[str, int] = {}

    def add(self, name: str, seconds: float, ok: bool) -> None:
        self.first.setdefault(name, seconds)
        if ok:
            self.samples.setdefault(name, []).append(seconds)
        else:
            self.errors[name] = self.errors.get(name, 0) + 1


async def timed(http: httpx.AsyncClient, timings: Timings, name: str, method: str, path: str, token: str) -> httpx.Response | None:
    start = time.perf_counter()
    try:
        resp = await http.request(method, path, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        timings.add(name, time.perf_counter() - start, False)
        return None
    timings.add(name, time.perf_counter() - start, resp.status_code < 400)
    return resp


async def load(base: str, admin: str, tenants: list[str], args: argparse.Namespace, cold: Timings) -> tuple[Timings, dict[str, Any]]:
    timings = Timings()
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base, timeout=300, limits=limits) as http:
        running = (await http.get("/v1/jobs", params={"state": "RUNNING", "limit": 1}, headers={"Authorization": f"Bearer {admin}"})).json()
        queued = (await http.get("/v1/jobs", params={"state": "QUEUED", "limit": 1}, headers={"Authorization": f"Bearer {admin}"})).json()
        nodes = [n["id"] for n in (await http.get("/v1/fleet", headers={"Authorization": f"Bearer {admin}"})).json()["nodes"][:1]]
        # Cold: the first answer of each view waits for its first computation.
        for path in VIEWS:
            await timed(http, cold, path, "GET", path, admin)
        deadline = time.monotonic() + args.duration

        async def tab(path: str, token: str) -> None:
            while time.monotonic() < deadline:
                await timed(http, timings, path, "GET", path, token)
                await asyncio.sleep(args.pause)

        async def cheap() -> None:
            while time.monotonic() < deadline:
                for name, job in (("/v1/jobs/{id} running", running), ("/v1/jobs/{id} queued", queued)):
                    if job:
                        await timed(http, timings, name, "GET", f"/v1/jobs/{job[0]['id']}", admin)
                await asyncio.sleep(0.1)

        async def changes() -> None:
            cordoned = False
            while nodes and time.monotonic() < deadline:
                await asyncio.sleep(args.change_every)
                verb = "uncordon" if cordoned else "cordon"
                await timed(http, timings, "POST /v1/nodes/{id}/(un)cordon", "POST", f"/v1/nodes/{nodes[0]}/{verb}", admin)
                cordoned = not cordoned
            if cordoned:
                await http.post(f"/v1/nodes/{nodes[0]}/uncordon", headers={"Authorization": f"Bearer {admin}"})

        tasks = [cheap(), changes()]
        for path in args.views.split(","):
            for i in range(args.tabs):
                tasks.append(tab(path, admin if i % 2 == 0 or path == "/metrics" else tenants[i % len(tenants)]))
        await asyncio.gather(*tasks)
        sizes = {p: len((await http.get(p, headers={"Authorization": f"Bearer {admin}"})).content) for p in VIEWS}
    return timings, sizes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="DATABASE_URL of the store to serve")
    parser.add_argument("--tokens", type=Path, required=True, help="tokens.json (admin and tenants' tokens), as scale_store writes it")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--tabs", type=int, default=4, help="clients per view")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds each client waits between two requests")
    parser.add_argument("--views", default=",".join(VIEWS), help="the views to poll (comma-separated)")
    parser.add_argument("--change-every", type=float, default=2.0, help="seconds between two cordons/uncordons (store changes)")
    args = parser.parse_args(argv)

    tokens = json.loads(args.tokens.read_text())
    admin, tenants = tokens["admin"], list(tokens["tenants"].values())
    port = free_port()
    env = {**os.environ, "FAIRGANG_DATABASE_URL": args.url, "FAIRGANG_TEMPORAL_ADDRESS": "127.0.0.1:1"}
    cmd = [sys.executable, "-m", "uvicorn", "api.app:create_app", "--factory", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/openapi.json", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the API did not start")
            time.sleep(0.2)
        cold = Timings()
        cpu0, wall0, load0 = cpu_seconds(proc.pid), time.perf_counter(), os.getloadavg()
        own0 = os.times()
        timings, sizes = asyncio.run(load(base, admin, tenants, args, cold))
        cpu, wall, rss = cpu_seconds(proc.pid) - cpu0, time.perf_counter() - wall0, peak_rss_mb(proc.pid)
        own = os.times()
        load1 = os.getloadavg()
        workers = children(proc.pid)
        worker_cpu = sum(cpu_seconds(c) for c in workers)
        worker_rss = max((peak_rss_mb(c) for c in workers), default=0.0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    print(f"store {args.url}; {args.tabs} clients per view, {args.pause}s pause; a store change every {args.change_every}s")
    print(f"{'endpoint':34s} {'answers':>8s} {'errors':>6s} {'cold':>8s} {'p50':>8s} {'p99':>8s} {'max':>8s} {'bytes':>9s}")
    for name in [*VIEWS, *sorted(n for n in timings.samples if n not in VIEWS)]:
        values = timings.samples.get(name, [])
        ms = [v * 1000 for v in values]
        size = str(sizes.get(name, "")) if name in sizes else ""
        print(
            f"{name:34s} {len(values):8d} {timings.errors.get(name, 0):6d} {cold.first.get(name, float('nan')) * 1000:7.0f}ms"
            f" {percentile(ms, 0.5):6.1f}ms {percentile(ms, 0.99):6.1f}ms {max(ms, default=float('nan')):6.0f}ms {size:>9s}"
        )
    answers = sum(len(v) for v in timings.samples.values())
    print(f"API process: {cpu:.1f} CPU s over {wall:.1f} s wall ({cpu / wall:.0%} of a core), peak RSS {rss:.0f} MB, {answers} answers")
    if workers:
        print(f"its view worker process: {worker_cpu:.1f} CPU s in all (first computations included), peak RSS {worker_rss:.0f} MB")
    client_cpu = own.user - own0.user + own.system - own0.system
    print(f"the clients (this process): {client_cpu:.1f} CPU s")
    print(f"load average (1 min) {load0[0]:.1f} at the start, {load1[0]:.1f} at the end, on {os.cpu_count()} cores")
    if timings.samples:
        all_views = [v for p in VIEWS for v in timings.samples.get(p, [])]
        print(f"views p99 {percentile(all_views, 0.99) * 1000:.1f} ms, median {statistics.median(all_views) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
