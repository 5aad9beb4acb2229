"""The agent's fencing rule: kill members the store no longer holds, never ones it cannot know of yet."""

from __future__ import annotations

from pathlib import Path

from activities.launch import RunningMember
from fairgang.settings import Settings
from worker_agent.agent import NodeAgent
from worker_agent.gpus import SimulatedGpus


def agent(tmp_path: Path) -> NodeAgent:
    settings = Settings(api_url="http://127.0.0.1:1", agent_state_dir=tmp_path / "state", log_dir=tmp_path / "logs")
    return NodeAgent(settings=settings, node_id="h1", gpu_type="H100", gpus=SimulatedGpus("h1", "H100", 8), labels={}, token="t")


def member(allocation_id: str, launched_at: float) -> RunningMember:
    return RunningMember(allocation_id, "j", 1, 0, pid=999999, grace_period_s=1.0, launched_at=launched_at)


def test_fence_kills_released_allocations_launched_before_the_answer_was_asked_for(tmp_path: Path) -> None:
    a = agent(tmp_path)
    killed: list[str] = []
    a.launcher.kill = killed.append  # type: ignore[method-assign, assignment]
    a.launcher.running = {"a-live": member("a-live", 10.0), "a-released": member("a-released", 10.0), "a-new": member("a-new", 25.0)}
    a.fence(["a-live"], asked_at=20.0)
    # a-new started after the request went out: the answer cannot know of it yet.
    assert killed == ["a-released"]
    a.fence(["a-live"], asked_at=30.0)
    assert killed == ["a-released", "a-new", "a-released"]
