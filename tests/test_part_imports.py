"""Each part of the platform loads what it runs. An agent starts once per node and again at each restart (a
platform's start is mostly its parts' imports): it loads neither the store, the workflows, the API nor the
placement service, none of which it uses."""

from __future__ import annotations

import subprocess
import sys

from tests.e2e.conftest import REPO

#: What an agent never needs (top-level packages, and the job workflow).
NOT_IN_AN_AGENT = ("store", "sqlalchemy", "sqlmodel", "alembic", "scheduler", "api", "activities", "fastapi", "workflows.job")


def test_an_agent_process_loads_neither_the_store_nor_the_workflows_nor_the_placement_service() -> None:
    # What `fairgang agent` imports: the CLI, the processes' entry points, and what run_agent imports.
    code = (
        "import sys, cli.main, cli.serve, cli.processes, worker_agent.agent, worker_agent.gpus\n"
        f"names = {NOT_IN_AN_AGENT!r}\n"
        "print(sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in names)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout
