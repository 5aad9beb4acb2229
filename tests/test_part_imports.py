"""Each part of the platform loads what it runs. An agent starts once per node and again at each restart (a
platform's start is mostly its parts' imports): it loads neither the store, the workflows, the API nor the
placement service, none of which it uses; the API and the control worker read and write the store but never
migrate it, so they do not load alembic (the scheduler and `fairgang migrate` do)."""

from __future__ import annotations

import subprocess
import sys

from tests.e2e.conftest import REPO

#: What an agent never needs (top-level packages, and the job workflow).
NOT_IN_AN_AGENT = ("store", "sqlalchemy", "sqlmodel", "alembic", "scheduler", "api", "activities", "fastapi", "workflows.job")


def test_an_agent_process_loads_neither_the_store_nor_the_workflows_nor_the_placement_service() -> None:
    # What `fairgang agent` imports: the CLI, the processes' entry points, and what run_agent imports.
    assert _loaded("cli.main, cli.serve, cli.processes, worker_agent.agent, worker_agent.gpus", NOT_IN_AN_AGENT) == "[]"


def _loaded(imports: str, names: tuple[str, ...]) -> str:
    code = (
        f"import sys, {imports}\n"
        f"names = {names!r}\n"
        "print(sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in names)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip()


def test_the_api_and_the_control_worker_use_the_store_without_loading_the_migrations() -> None:
    imports = "cli.main, cli.serve, cli.processes, api.app, activities.store, activities.sweeps, workflows.job, workflows.sweep, store.db"
    assert _loaded(imports, ("alembic",)) == "[]"
    # ... while what migrates still finds them.
    assert _loaded("store.db; store.db.alembic_config('sqlite:///x.db')", ("alembic",)) != "[]"
