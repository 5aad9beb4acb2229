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


def test_a_predicted_start_shows_its_interval_and_the_most_likely_time(utc: None) -> None:
    from cli.kit import start_window

    now = 1796212800.0  # 2026-12-02 12:00 UTC
    hour = 3600.0
    assert start_window(now + 2.5 * hour, now + 3 * hour + 300, now + 4 * hour + 600, now) == "14:30\u201316:10 UTC, most likely 15:05"
    assert start_window(now - 5, now + 600, now + hour, now) == "now\u201313:00 UTC, most likely 12:10"
    assert start_window(now + 600, now + 600, now + 600, now) == "12:10 UTC"
    assert start_window(now - 5, now, now, now) == "now"
    assert start_window(now + 600, now + hour, None, now) == "12:10 or later UTC, most likely 13:00"
    assert start_window(None, None, None, now) == "unknown"
    # Not all today: with dates.
    assert start_window(now + hour, now + 13 * hour, now + 20 * hour, now) == (
        "2026-12-02 13:00\u20132026-12-03 08:00 UTC, most likely 2026-12-03 01:00"
    )


def test_the_queue_and_a_waiting_job_show_the_interval(monkeypatch: pytest.MonkeyPatch, utc: None) -> None:
    from cli import fleet as cli_fleet
    from cli import jobs as cli_jobs

    now = 1796212800.0  # 2026-12-02 12:00 UTC
    monkeypatch.setattr(time, "time", lambda: now)
    job = {"id": "j-1", "tenant": "alpha", "name": "train", "gpu_count": 8, "gpu_type": "H100", "priority": 100}
    row = {"position": 1, "job": job | {"created_at": now - 60, "pending_reason": "waiting for GPUs"}}
    row |= {"estimated_start": now + 3600, "estimated_start_low": now + 1800, "estimated_start_high": now + 7200}
    console = Console(width=300, record=True)
    console.print(cli_fleet._queue_table([row]))
    text = console.export_text()
    assert "12:30\u201314:00 UTC, most likely 13:00 (in 1h)" in text, text
    line = cli_jobs._wait_line(job | {"state": "QUEUED", "attempt": 1, "queue_position": 1, **{k: v for k, v in row.items() if k != "job"}})
    assert line == "QUEUED  attempt 1  position 1  starts 12:30\u201314:00 UTC, most likely 13:00", line
    assert cli_fleet._queue_table([row | {"estimated_start": None}]).columns[7]._cells == ["unknown"]


def test_fairgang_job_shows_a_waiting_jobs_position_and_start_interval(monkeypatch: pytest.MonkeyPatch, utc: None) -> None:
    import httpx

    from cli import jobs as cli_jobs
    from cli.kit import OutputFormat

    now = 1796212800.0  # 2026-12-02 12:00 UTC
    monkeypatch.setattr(time, "time", lambda: now)
    detail = {
        "id": "j-1", "tenant": "alpha", "name": "train", "state": "QUEUED", "gpu_count": 8, "gpu_type": "H100", "attempt": 1,
        "exit_code": None, "created_at": now - 60, "pending_reason": "waiting for GPUs", "spec": {"max_runtime": 3600.0},
        "temporal_url": "http://temporal/j-1", "events": [], "allocation": None, "queue_position": 2,
        "estimated_start": now + 3600, "estimated_start_low": now + 1800, "estimated_start_high": now + 7200,
    }  # fmt: skip

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/jobs/j-1"
        return httpx.Response(200, json=detail)

    monkeypatch.setattr(cli_jobs, "_client", lambda url, token: httpx.Client(base_url="http://api", transport=httpx.MockTransport(answer)))
    recorded = Console(width=300, record=True)
    monkeypatch.setattr(cli_jobs, "console", recorded)
    cli_jobs.job("j-1", api_url="http://api", token="t", output=OutputFormat.table)
    assert "queue position 2, starts 12:30\u201314:00 UTC, most likely 13:00" in recorded.export_text()


def test_fairgang_jobs_passes_its_search_to_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpx

    from cli import jobs as cli_jobs
    from cli.kit import OutputFormat

    asked: list[dict[str, str]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/jobs"
        asked.append(dict(request.url.params))
        return httpx.Response(200, json=[])

    monkeypatch.setattr(cli_jobs, "_client", lambda url, token: httpx.Client(base_url="http://api", transport=httpx.MockTransport(answer)))
    cli_jobs.jobs(
        tenant=None,  # type: ignore[arg-type]  # typer gives None for an option not given
        state=None,  # type: ignore[arg-type]
        label=[],
        search="bert",
        watch=False,
        limit=50,
        api_url="http://api",
        token="t",
        output=OutputFormat.json,
    )
    assert asked == [{"search": "bert", "limit": "50"}]
