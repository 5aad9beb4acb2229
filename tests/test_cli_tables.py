"""What the CLI's tables say: a schedule's cron or interval in words and its next run with its date."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from rich.console import Console

from cli import sweeps as cli_sweeps
from cli.sweeps import _print_schedules


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_schedule_ls_shows_the_cron_or_the_interval_and_the_next_run_with_its_date(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, utc: None
) -> None:
    monkeypatch.setattr(cli_sweeps, "console", Console(width=200))  # whatever the terminal (or none) is
    base = {"tenant": "alpha", "overlap": "skip", "paused": False, "actions_taken": 3, "running": []}
    rows = [
        base | {"id": "nightly", "cron": ["0 2 * * *"], "interval_s": [], "next_runs": [1796263200.0]},
        base | {"id": "hourly", "cron": [], "interval_s": [5400.0], "next_runs": [1796212800.0]},
        base | {"id": "held", "cron": [], "interval_s": [86400.0], "next_runs": [1796212800.0], "paused": True},
    ]
    _print_schedules(rows)
    out = capsys.readouterr().out
    lines = {line.split()[1]: line for line in out.splitlines() if line.strip().startswith(("│ nightly", "│ hourly", "│ held"))}
    assert "cron 0 2 * * *" in lines["nightly"] and "2026-12-03 02:00 UTC" in lines["nightly"]
    assert "every 1h30m" in lines["hourly"] and "2026-12-02 12:00 UTC" in lines["hourly"]
    assert "every 1d" in lines["held"] and "2026-12-02" not in lines["held"]  # paused: no next run


def test_help_shows_the_allowed_values_and_flags_without_a_value() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    def helped(*args: str) -> str:
        env = os.environ | {"COLUMNS": "200", "FAIRGANG_CONFIG": "/nonexistent/config.yaml"}
        root = Path(__file__).resolve().parents[1]
        return subprocess.run([sys.executable, "-m", "cli", *args, "--help"], cwd=root, env=env, capture_output=True, text=True).stdout

    submit = helped("submit")
    wait_line = next(line for line in submit.splitlines() if "--wait" in line)
    assert "<bool>" not in wait_line and "<table|wide|json|yaml|name>" in submit
    jobs = helped("jobs")
    assert "QUEUED|HELD|PLACED|LAUNCHING|RUNNING|PREEMPTING|SUCCEEDED|FAILED|CANCELLED|TIMED_OUT" in jobs.replace(" ", "")
    assert "QUEUED|HELD" in helped("history").replace(" ", "")


def test_an_elastic_jobs_gpus_show_its_range_and_its_size_now() -> None:
    from cli.jobs import gpus_cell

    fixed = {"gpu_count": 8, "gpu_max": None, "gpu_type": "H100"}
    assert gpus_cell(fixed) == "8xH100"
    assert gpus_cell({**fixed, "gpu_max": 32}) == "8-32xH100"
    assert gpus_cell({**fixed, "gpu_max": 32, "gpus_now": 16}) == "16 of 8-32xH100"
