"""The container runtime, for real: podman runs the spec's image with the job's env, checkpoint mount
and GPUs, and stops it with SIGTERM, the grace period, then SIGKILL.

Skipped, with the reason, where podman cannot run a container here.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import small_cluster
from tests.e2e.conftest import TERMINAL, Platform, only

# The container runtime does not touch the store: SQLite only.
pytestmark = [pytest.mark.e2e, only("sqlite")]
IMAGE = "localhost/fairgang-test-busybox"


def _podman_problem(conf: Path, work: Path) -> str | None:
    if shutil.which("podman") is None or shutil.which("busybox") is None:
        return "podman or busybox is not installed (apt-get install podman runc catatonit busybox-static)"
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    rootfs = work / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        busybox = tarfile.TarInfo("bin/busybox")
        data = Path(shutil.which("busybox") or "").read_bytes()
        busybox.size, busybox.mode = len(data), 0o755
        tar.addfile(busybox, fileobj=io.BytesIO(data))
        for applet in ("sh", "sleep", "echo", "cat", "ls", "grep", "touch", "id"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
    imported = subprocess.run(["podman", "import", str(rootfs), IMAGE], env=env, capture_output=True, text=True, timeout=120)
    if imported.returncode != 0:
        return f"podman import failed: {imported.stderr.strip()[-300:]}"
    probe = ["podman", "run", "--rm", "--init", IMAGE, "/bin/echo", "ok"]
    ran = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    if ran.returncode != 0 or "ok" not in ran.stdout:
        return f"podman cannot run a container here: {ran.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="module")
def podman_platform(platform_factory: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    work = tmp_path_factory.mktemp("podman")
    conf = work / "containers.conf"
    # runc and lowered ulimits: what podman needs on these machines (see the README).
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\n')
    problem = _podman_problem(conf, work)
    if problem:
        print(f"skipping container runtime tests: {problem}")
        pytest.skip(problem)
    old = os.environ.get("CONTAINERS_CONF")
    os.environ["CONTAINERS_CONF"] = str(conf)
    try:
        cluster = small_cluster()
        for node in cluster.nodes:
            node.runtime = "podman"
        platform: Platform = platform_factory(cluster)
        platform.start()
        yield platform
    finally:
        if old is None:
            os.environ.pop("CONTAINERS_CONF", None)
        else:
            os.environ["CONTAINERS_CONF"] = old


def container_spec(name: str, script: str, **extra: Any) -> dict[str, Any]:
    spec = {
        "name": name,
        "image": IMAGE,
        "entrypoint": ["/bin/sh", "-c", script],
        "gpu_type": "H100-80GB",
        "gpu_count": 2,
        "max_runtime": "10m",
        "checkpoint_dir": f"/ckpt/alpha/{name}",
        "grace_period": "3s",
    }
    spec.update(extra)
    return spec


def containers(platform: Platform) -> str:
    out = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True, timeout=60)
    return out.stdout


def test_container_runs_the_image_with_env_and_checkpoint_mount(podman_platform: Platform) -> None:
    p = podman_platform
    script = 'echo "in container $FAIRGANG_JOB_ID gpus=$CUDA_VISIBLE_DEVICES ckpt=$CHECKPOINT_DIR"; echo step-1 > "$CHECKPOINT_DIR/LATEST"'
    job = p.submit(container_spec("boxed", script))
    done = p.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED", (done, p.logs())
    gpus = ",".join(map(str, done["allocation"]["members"][0]["gpu_indices"]))
    with p.client("alpha-token") as http:
        log = http.get(f"/v1/jobs/{job['id']}/logs").text
    assert f"in container {job['id']} gpus={gpus} ckpt=/ckpt/alpha/boxed" in log
    # The mount: what the job wrote inside is on the node, and the checkpoint is reported in the job's view.
    assert (p.data_dir / "checkpoints" / "ckpt" / "alpha" / "boxed" / "LATEST").read_text().strip() == "step-1"
    assert done["latest_checkpoint"] == "/ckpt/alpha/boxed/step-1"
    assert f"fg-{done['allocation']['id']}" not in containers(p)


def test_a_container_member_has_no_capabilities_no_way_to_gain_privileges_and_a_read_only_root(podman_platform: Platform) -> None:
    p = podman_platform
    script = (
        'grep -E "^(CapEff|CapPrm|CapBnd|NoNewPrivs):" /proc/self/status; '
        "touch /etc/owned 2>/dev/null && echo root=writable || echo root=read-only; "
        'touch /tmp/scratch && echo tmp=writable; touch "$CHECKPOINT_DIR/mine" && echo ckpt=writable; '
        "ls /checkpoints 2>/dev/null || echo other-mounts=none"
    )
    job = p.submit(container_spec("privileges", script))
    done = p.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "SUCCEEDED", (done, p.logs())
    with p.client("alpha-token") as http:
        log = http.get(f"/v1/jobs/{job['id']}/logs").text
    lines = dict(line.replace(":\t", "=").split("=", 1) for line in log.split("\n") if "=" in line or ":\t" in line)
    for caps in ("CapEff", "CapPrm", "CapBnd"):
        assert int(lines[caps], 16) == 0, (caps, lines)
    assert lines["NoNewPrivs"] == "1" and lines["root"] == "read-only", lines
    assert lines["tmp"] == "writable" and lines["ckpt"] == "writable" and lines["other-mounts"] == "none", lines


@pytest.mark.parametrize(("handles_term", "expect"), [(True, "got TERM"), (False, "")])
def test_cancel_stops_the_container_gracefully_then_kills_it(podman_platform: Platform, handles_term: bool, expect: str) -> None:
    p = podman_platform
    trap = "trap 'echo got TERM; exit 0' TERM" if handles_term else "trap '' TERM"
    job = p.submit(container_spec(f"stop-{handles_term}".lower(), f"{trap}; echo started; while true; do sleep 0.2; done"))
    running = p.wait_for(job["id"], {"RUNNING"}, timeout=120)
    # RUNNING once the container CLI has started; the container itself shows up in podman's list a moment later.
    name, deadline = f"fg-{running['allocation']['id']}-r0", time.monotonic() + 60
    while name not in containers(p):
        assert time.monotonic() < deadline, "the member runs as a container"
        time.sleep(0.2)
    with p.client("alpha-token") as http:
        assert http.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    done = p.wait_for(job["id"], TERMINAL, timeout=120)
    assert done["state"] == "CANCELLED"
    assert f"fg-{done['allocation']['id']}" not in containers(p)
    with p.client("alpha-token") as http:
        log = http.get(f"/v1/jobs/{job['id']}/logs").text
    assert "started" in log
    if expect:
        assert expect in log
    released = [e for e in done["events"] if e["kind"] == "CANCELLED"]
    assert released, done["events"]


def running_containers() -> str:
    out = subprocess.run(["podman", "ps", "--format", "{{.Names}}"], capture_output=True, text=True, timeout=60)
    return out.stdout


#: Each attempt appends "attempt uptime" to $CHECKPOINT_DIR/ticks (on the node) every 0.1 s; attempt 1 ignores
#: SIGTERM and never ends on its own, attempt 2 ends after about 3 s.
TICKS = (
    'if [ "$FAIRGANG_ATTEMPT" = 1 ]; then trap "" TERM; n=1000000; else n=30; fi; echo started; i=0; '
    'while [ $i -lt $n ]; do read up _ < /proc/uptime; echo "$FAIRGANG_ATTEMPT $up" >> "$CHECKPOINT_DIR/ticks"; '
    "i=$((i+1)); sleep 0.1; done"
)


def _tick_spans(ticks: Path) -> dict[int, tuple[float, float]]:
    """attempt -> (first, last) uptime its container recorded itself alive."""
    spans: dict[int, tuple[float, float]] = {}
    for line in ticks.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            attempt, t = int(parts[0]), float(parts[1])
            first, last = spans.get(attempt, (t, t))
            spans[attempt] = (min(first, t), max(last, t))
    return spans


def test_a_frozen_agents_container_that_ignores_sigterm_is_stopped_by_its_shim(podman_platform: Platform) -> None:
    """SIGSTOP of the agent running a container that ignores SIGTERM, past the lost-node timeout.

    The container runs under conmon, not the agent: only the member's shim, when the lease runs out, can stop
    it (SIGTERM and SIGKILL by name), before the workflow queues the job again on the other node.
    """
    p = podman_platform
    job = p.submit(container_spec("frozen-agent", TICKS))
    first = p.wait_for(job["id"], {"RUNNING"}, timeout=120)["allocation"]
    node, name = first["members"][0]["node_id"], f"fg-{first['id']}-r0"
    ticks = p.data_dir / "checkpoints" / "ckpt" / "alpha" / "frozen-agent" / "ticks"
    deadline = time.monotonic() + 120
    while not ticks.exists() or 1 not in _tick_spans(ticks):
        assert time.monotonic() < deadline, p.logs()
        time.sleep(0.2)
    agent = int(json.loads((p.data_dir / "pids.json").read_text())[f"agent-{node}"])
    os.kill(agent, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 300
        while (seen := p.job(job["id"]))["attempt"] < 2 or seen["state"] != "RUNNING":
            assert time.monotonic() < deadline, seen
            time.sleep(0.3)
        # The agent is still frozen: attempt 1's container, which ignores SIGTERM, was stopped by its shim alone.
        assert name not in running_containers(), "attempt 1's container still runs on the frozen agent's node"
        assert node not in [m["node_id"] for m in seen["allocation"]["members"]]
        while name in containers(p):  # and removed (its `run` client's --rm)
            assert time.monotonic() < deadline, containers(p)
            time.sleep(0.3)
        with p.client("admin-token") as http:
            log = http.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": 1, "rank": 0}).text
        assert "no keepalive from the agent" in log, log
        while 2 not in _tick_spans(ticks):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        os.kill(agent, signal.SIGCONT)
    done = p.wait_for(job["id"], TERMINAL, timeout=300)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 2, done
    spans = _tick_spans(ticks)
    assert spans[1][1] < spans[2][0], f"attempt 1 still ran at {spans[1][1]}, after attempt 2 started at {spans[2][0]}"
    assert f"fg-{done['allocation']['id']}" not in containers(p) and name not in containers(p)
    deadline = time.monotonic() + 90
    with p.client("admin-token") as http:  # the node comes back (registers again) for whatever runs next
        while next(n for n in http.get("/v1/fleet").json()["nodes"] if n["id"] == node)["state"] != "READY":
            assert time.monotonic() < deadline
            time.sleep(0.3)
