"""``fairgang sweep ...`` and ``fairgang schedule ...``: sweeps, once or on a schedule (SPEC R9.3)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table

from cli.kit import ApiUrl, Output, OutputFormat, Token, console, date_time, err_console, flag
from cli.kit import check as _check
from cli.kit import client as _client
from cli.kit import emit as _emit
from cli.kit import fail as _fail
from cli.kit import ts as _ts
from fairgang.durations import format_duration, parse_duration
from fairgang.spec import SpecError
from fairgang.sweeps import load_schedule_text, load_sweep_text

sweep_app = typer.Typer(help="Hyperparameter sweeps: trials of one job template, each an ordinary job.", no_args_is_help=True)
schedule_app = typer.Typer(help="Sweeps on a cron expression or an interval (Temporal Schedules).", no_args_is_help=True)
SWEEP_TERMINAL = {"COMPLETED", "CANCELLED", "FAILED"}


def _read(file: Path) -> dict[str, Any]:
    try:
        text = file.read_text()
    except OSError as err:
        return _fail(f"{file}: {err}")
    try:
        data = json.loads(text)
    except ValueError:
        data = yaml.safe_load(text)
    return data if isinstance(data, dict) else {}


def _print_sweeps(rows: list[dict[str, Any]]) -> None:
    table = Table("ID", "TENANT", "NAME", "STATE", "TRIALS", "CAP", "SCHEDULE", "CREATED", "BEST")
    for r in rows:
        best = (r.get("summary") or {}).get("best")
        best_text = f"#{best['index']} {best['metric']}={best['value']:.6g}" if best else ""
        table.add_row(
            r["id"], r["tenant"], r["name"], r["state"], str(r["trial_count"]), str(r["max_concurrent"]),
            r.get("schedule_id") or "", _ts(r["created_at"]), best_text,
        )  # fmt: skip
    console.print(table)


def _show_sweep(s: dict[str, Any]) -> None:
    _print_sweeps([s])
    console.print("trials: " + ", ".join(f"{k} {v}" for k, v in sorted(s["counts"].items())))
    summary = s.get("summary") or {}
    if summary:
        console.print("summary: " + ", ".join(f"{k} {v}" for k, v in summary.items() if isinstance(v, int)))
    trials = Table("#", "PARAMETERS", "STATE", "JOB", "EXIT", "METRICS", "WHY")
    for t in s["trials"]:
        params = " ".join(f"{k}={v}" for k, v in t["params"].items())
        metrics = " ".join(f"{k}={v:.6g}" for k, v in (t.get("metrics") or {}).items())
        exit_code = "" if t.get("exit_code") is None else str(t["exit_code"])
        trials.add_row(str(t["index"]), params, t["state"], t.get("job_id") or "", exit_code, metrics, t.get("reason") or "")
    console.print(trials)
    console.print(f"temporal {s['temporal_url']}")


@sweep_app.command("submit")
def sweep_submit(
    file: Path,
    wait: bool = flag("--wait", help="Wait until the sweep ends; exit 0 only if it COMPLETED with no failed trial."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: OutputFormat = Output,
) -> None:
    """Submit a sweep spec (YAML or JSON)."""
    try:
        load_sweep_text(file.read_text())
    except OSError as err:
        _fail(f"{file}: {err}")
    except SpecError as err:
        lines = "\n".join(f"  {p.field}: {p.reason}" for p in err.problems)
        _fail(f"{file}: sweep spec refused:\n{lines}")
    with _client(api_url, token) as http:
        result = _check(http.post("/v1/sweeps", json=_read(file)))
        sweep = result["sweep"]
        err_console.print(f"{'submitted' if result['created'] else 'already submitted'}: {sweep['id']} ({sweep['trial_count']} trials)")
        if not wait:
            _emit(result, output, lambda r: console.print(r["sweep"]["id"]))
            return
        while sweep["state"] not in SWEEP_TERMINAL:
            time.sleep(1.0)
            sweep = _check(http.get(f"/v1/sweeps/{sweep['id']}"))
        _emit(sweep, output, _show_sweep)
        summary = sweep.get("summary") or {}
        ok = sweep["state"] == "COMPLETED" and not any(summary.get(k) for k in ("failed", "timed_out", "refused", "cancelled"))
        raise typer.Exit(0 if ok else 1)


@sweep_app.command("ls")
def sweep_ls(
    state: str = typer.Option(None, "--state"),
    schedule: str = typer.Option(None, "--schedule", help="Only the runs of this schedule."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: OutputFormat = Output,
) -> None:
    """List sweeps (yours, or all for an admin)."""
    params = {k: v for k, v in {"state": state, "schedule_id": schedule}.items() if v}
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/sweeps", params=params)), output, _print_sweeps)


@sweep_app.command("show")
def sweep_show(sweep_id: str, api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output) -> None:
    """Show a sweep: every trial with its parameters, job and state; the summary when it ended."""
    with _client(api_url, token) as http:
        _emit(_check(http.get(f"/v1/sweeps/{sweep_id}")), output, _show_sweep)


@sweep_app.command("cancel")
def sweep_cancel(sweep_id: str, api_url: str = ApiUrl, token: str = Token) -> None:
    """Cancel a sweep: no more trials start; running trials stop gracefully."""
    with _client(api_url, token) as http:
        data = _check(http.post(f"/v1/sweeps/{sweep_id}/cancel"))
    console.print(f"cancel requested for {data['id']} (now {data['state']})")


# ---------------------------------------------------------------- schedules


def _print_schedules(rows: list[dict[str, Any]]) -> None:
    table = Table("ID", "TENANT", "WHEN", "OVERLAP", "PAUSED", "RUNS", "NEXT", "RUNNING")
    for r in rows:
        when = ", ".join([*(f"cron {c}" for c in r["cron"]), *(f"every {format_duration(s)}" for s in r["interval_s"])])
        nxt = date_time(r["next_runs"][0]) if r["next_runs"] and not r["paused"] else "-"
        table.add_row(
            r["id"], r["tenant"], when, r["overlap"], "yes" if r["paused"] else "no", str(r["actions_taken"]), nxt, " ".join(r["running"])
        )
    console.print(table)


@schedule_app.command("create")
def schedule_create(file: Path, api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output) -> None:
    """Create a schedule from a file: name, schedule {cron | interval}, overlap, sweep."""
    try:
        load_schedule_text(file.read_text())
    except OSError as err:
        _fail(f"{file}: {err}")
    except SpecError as err:
        lines = "\n".join(f"  {p.field}: {p.reason}" for p in err.problems)
        _fail(f"{file}: schedule refused:\n{lines}")
    with _client(api_url, token) as http:
        _emit(_check(http.post("/v1/schedules", json=_read(file))), output, lambda r: _print_schedules([r]))


@schedule_app.command("ls")
def schedule_ls(api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output) -> None:
    """List schedules (yours, or all for an admin)."""
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/schedules")), output, _print_schedules)


def _act(schedule_id: str, action: str, api_url: str | None, token: str | None, output: str, **params: Any) -> None:
    with _client(api_url, token) as http:
        _emit(
            _check(http.post(f"/v1/schedules/{schedule_id}/{action}", params={k: v for k, v in params.items() if v})),
            output,
            lambda r: _print_schedules([r]),
        )


@schedule_app.command("pause")
def schedule_pause(
    schedule_id: str, note: str = typer.Option(None, "--note"), api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output
) -> None:
    """Stop the schedule firing (a sweep already running goes on)."""
    _act(schedule_id, "pause", api_url, token, output, note=note)


@schedule_app.command("resume")
def schedule_resume(
    schedule_id: str, note: str = typer.Option(None, "--note"), api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output
) -> None:
    """Let the schedule fire again."""
    _act(schedule_id, "resume", api_url, token, output, note=note)


@schedule_app.command("trigger")
def schedule_trigger(schedule_id: str, api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output) -> None:
    """Run the schedule's sweep now (its overlap policy applies)."""
    _act(schedule_id, "trigger", api_url, token, output)


@schedule_app.command("backfill")
def schedule_backfill(
    schedule_id: str,
    since: str = typer.Option(..., "--since", help="How far back, e.g. 6h: start the runs missed since then."),
    overlap: str = typer.Option(None, "--overlap", help="skip, buffer_one or cancel_previous (default: run them all in turn)."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: OutputFormat = Output,
) -> None:
    """Start the runs the schedule missed (e.g. while paused) in the last SINCE."""
    now = time.time()
    try:
        start = now - parse_duration(since)
    except ValueError as err:
        _fail(f"--since: {err}")
    body = {"start": start, "end": now, **({"overlap": overlap} if overlap else {})}
    with _client(api_url, token) as http:
        _emit(_check(http.post(f"/v1/schedules/{schedule_id}/backfill", json=body)), output, lambda r: _print_schedules([r]))


@schedule_app.command("delete")
def schedule_delete(schedule_id: str, api_url: str = ApiUrl, token: str = Token) -> None:
    """Delete a schedule (sweeps it started go on)."""
    with _client(api_url, token) as http:
        resp = http.delete(f"/v1/schedules/{schedule_id}")
        if resp.status_code >= 400:
            _check(resp)
    console.print(f"deleted {schedule_id}")
