"""Job isolation on a node (SPEC R8.4): a member run by an isolating agent (root) is its tenant's own uid, and
every attack a hostile job tried on a node fails: the agent's environment and signals, its state and credential,
another tenant's log and checkpoint, a store file. The same member run without isolation gets through, so the
test fails when the isolation does."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from fairgang.cluster import ClusterConfig
from fairgang.isolation import tenant_uid, uid_collisions
from worker_agent.isolation import RunAs, keep_private, read_token_file, write_token_file
from worker_agent.launch import LaunchActivities
from workflows.messages import LaunchInput

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing a member's uid needs root")

#: What a hostile job tries (argv[1]: a JSON of the targets); it prints what each attempt got.
ATTACKER = r"""
import json, os, sys
t = json.loads(sys.argv[1])
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "succeeded"
    except OSError as err:
        out[name] = f"refused: {err.strerror}"
attempt("read the agent's environment", lambda: open(f"/proc/{t['agent_pid']}/environ", "rb").read())
attempt("signal the agent", lambda: os.kill(t["agent_pid"], 0))
attempt("read the node credential", lambda: open(t["token_file"]).read())
attempt("list the agent's state", lambda: os.listdir(t["state_dir"]))
attempt("read another tenant's log", lambda: open(t["other_log"]).read())
attempt("read another tenant's checkpoint", lambda: open(t["other_checkpoint"]).read())
attempt("list another tenant's checkpoints", lambda: os.listdir(os.path.dirname(t["other_checkpoint"])))
attempt("read the store", lambda: open(t["store"], "rb").read())
attempt("write the store", lambda: open(t["store"], "ab").write(b"x"))
for path in t.get("more", []):
    attempt(f"read {path}", lambda: open(path, "rb").read())
attempt("write its own checkpoint", lambda: open(os.path.join(os.environ["CHECKPOINT_DIR"], "mine"), "w").write("x"))
attempt("write its own temporary file", lambda: open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "scratch"), "w").write("x"))
out["uid"], out["gid"], out["groups"], out["tmpdir"] = os.getuid(), os.getgid(), os.getgroups(), os.environ.get("TMPDIR", "")
print("VERDICT " + json.dumps(out), flush=True)
"""

ATTACKS = [
    "read the agent's environment",
    "signal the agent",
    "read the node credential",
    "list the agent's state",
    "read another tenant's log",
    "read another tenant's checkpoint",
    "list another tenant's checkpoints",
    "read the store",
    "write the store",
]


@pytest.fixture
def node_dir() -> Iterator[Path]:
    """A node's folders where another uid may pass (pytest's own tmp folders are closed to other users)."""
    root = Path(tempfile.mkdtemp(prefix="fairgang-isolation-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def reachable_python() -> str:
    """An interpreter another uid can run (this one may live in a folder closed to others, as pyenv's under /root)."""
    for candidate in ("/usr/bin/python3", os.path.realpath(sys.executable)):
        path = Path(candidate).resolve()
        if path.exists() and all(os.stat(p).st_mode & 0o001 for p in (path, *path.parents)):
            return str(path)
    pytest.skip("no Python that another uid can run")


def launch_input(node: Path, tenant: str, allocation_id: str, argv: list[str]) -> LaunchInput:
    return LaunchInput(
        job_id=f"j-{allocation_id}", attempt=1, allocation_id=allocation_id, node_id="h1", rank=0, world_size=1,
        gpu_indices=[0], gpus_per_member=1, argv=argv, env={}, checkpoint_dir=f"/{tenant}/j-{allocation_id}",
        grace_period_s=1.0, master_addr="h1", master_port=29500, tenant=tenant,
    )  # fmt: skip


def launcher(node: Path, run_as: RunAs | None) -> LaunchActivities:
    state = node / "state" / "h1"
    keep_private(state.parent)
    return LaunchActivities(node_id="h1", log_dir=node / "logs", checkpoint_root=node / "checkpoints", state_dir=state, run_as=run_as)


async def run(launch: LaunchActivities, inp: LaunchInput) -> None:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, started_time=datetime.now(UTC))
    result = await asyncio.wait_for(env.run(launch.launch, inp), 60)
    assert result.how == "exited" and result.exit_code == 0, result


async def attack(node: Path, run_as: RunAs | None) -> dict[str, Any]:
    """A tenant 'beta' job writes a checkpoint; then a tenant 'alpha' job attacks the node, 'beta' and the store."""
    launch = launcher(node, run_as)
    secret = "echo beta-secret; echo weights > $CHECKPOINT_DIR/weights"
    await run(launch, launch_input(node, "beta", "b-1", ["/bin/sh", "-c", secret]))
    token_file = node / "credentials" / "h1.token"
    write_token_file(token_file, "node-credential")
    store = node / "store" / "fairgang.db"
    keep_private(store.parent, 0o711)
    os.close(os.open(store, os.O_CREAT | os.O_WRONLY, 0o600))  # as a platform under umask 077 creates it
    targets = {
        "agent_pid": os.getpid(),
        "token_file": str(token_file),
        "state_dir": str(node / "state" / "h1"),
        "other_log": str(node / "logs" / "j-b-1" / "attempt-1-rank-0.log"),
        "other_checkpoint": str(node / "checkpoints" / "beta" / "j-b-1" / "weights"),
        "store": str(store),
    }
    python = reachable_python()
    await run(launch, launch_input(node, "alpha", "a-1", [python, "-I", "-c", ATTACKER, json.dumps(targets)]))
    log = (node / "logs" / "j-a-1" / "attempt-1-rank-0.log").read_text()
    [verdict] = [line.removeprefix("VERDICT ") for line in log.splitlines() if line.startswith("VERDICT ")]
    return dict(json.loads(verdict))


async def test_an_isolated_member_is_its_tenants_uid_and_every_attack_on_the_node_fails(node_dir: Path) -> None:
    run_as = RunAs(uid_base=1_000_000_000, uid_span=1_000_000_000, tmp_root=node_dir / "tmp")
    got = await attack(node_dir, run_as)
    uid = tenant_uid("alpha")
    assert (got["uid"], got["gid"], got["groups"]) == (uid, uid, []), got
    assert not [name for name in ATTACKS if got[name] == "succeeded"], got
    assert got["write its own checkpoint"] == got["write its own temporary file"] == "succeeded", got
    # Its checkpoints are its tenant's alone; the private temporary folder is gone with the member.
    ckpt = node_dir / "checkpoints" / "alpha" / "j-a-1"
    assert (ckpt.stat().st_uid, ckpt.stat().st_mode & 0o777) == (uid, 0o700)
    assert got["tmpdir"].startswith(str(node_dir / "tmp")) and not await asyncio.to_thread(os.path.exists, got["tmpdir"])


async def test_without_isolation_the_same_member_gets_through(node_dir: Path) -> None:
    """The control: as the agent's uid the attacks succeed, so the test above fails when isolation does."""
    got = await attack(node_dir, None)
    assert got["uid"] == os.getuid()
    for name in ("read the agent's environment", "list the agent's state", "read another tenant's log", "read the store"):
        assert got[name] == "succeeded", (name, got)


async def test_a_resumed_attempt_owns_the_checkpoints_of_the_last_one(node_dir: Path) -> None:
    """Files an earlier attempt left (or a restore wrote as root) are handed to the tenant's uid before the next."""
    run_as = RunAs(uid_base=1_000_000_000, uid_span=1_000_000_000, tmp_root=node_dir / "tmp")
    launch = launcher(node_dir, run_as)
    ckpt = node_dir / "checkpoints" / "alpha" / "j-a-2"
    (ckpt / "step-1").mkdir(parents=True)
    (ckpt / "step-1" / "model").write_text("root wrote this\n")
    await run(launch, launch_input(node_dir, "alpha", "a-2", ["/bin/sh", "-c", "echo more >> $CHECKPOINT_DIR/step-1/model"]))
    assert (ckpt / "step-1" / "model").read_text() == "root wrote this\nmore\n"
    assert (ckpt / "step-1" / "model").stat().st_uid == tenant_uid("alpha")


def test_the_node_credential_file_is_refused_when_others_can_read_it(tmp_path: Path) -> None:
    path = tmp_path / "h1.token"
    write_token_file(path, "secret")
    assert read_token_file(path) == "secret" and path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        read_token_file(path)


def test_uids_are_one_per_tenant_the_same_everywhere_and_collisions_are_found() -> None:
    assert tenant_uid("alpha") == tenant_uid("alpha") != tenant_uid("beta")
    assert 1_000_000_000 <= tenant_uid("alpha") < 2_000_000_000
    assert uid_collisions([f"t{i}" for i in range(50)]) == []
    # In a range of 3 uids, 10 tenants must share.
    clashes = uid_collisions([f"t{i}" for i in range(10)], base=1000, span=3)
    assert len(clashes) == 7 and all(tenant_uid(a, base=1000, span=3) == tenant_uid(b, base=1000, span=3) for a, b in clashes)
    with pytest.raises(ValueError, match="uid range"):
        tenant_uid("alpha", base=2**31 - 1, span=10)


def test_a_cluster_whose_tenants_would_share_a_uid_is_refused() -> None:
    seen: dict[int, str] = {}
    for i in itertools.count():
        name, uid = f"t{i}", tenant_uid(f"t{i}")
        if uid in seen:
            break
        seen[uid] = name
    with pytest.raises(ValueError, match=f"tenants '{seen[uid]}' and '{name}' would run their jobs as one uid"):
        ClusterConfig.model_validate({"tenants": [{"name": seen[uid]}, {"name": name}, {"name": "alpha"}]})
    assert len(ClusterConfig.model_validate({"tenants": [{"name": seen[uid]}, {"name": "alpha"}]}).tenants) == 2
