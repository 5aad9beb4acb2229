"""Accounting commands, as Slurm's sacct and sreport: ``history`` (jobs over a time range) and ``usage``
(GPU-hours and waits per tenant and GPU type), each as a table, CSV or JSON."""

from __future__ import annotations

import csv
import json
import sys
from typing import Any

import typer
from rich.table import Table

from cli.kit import ApiUrl, Token, console
from cli.kit import check as _check
from cli.kit import client as _client
from cli.kit import date_time as _date_time
from cli.kit import fail as _fail
from fairgang.durations import format_duration
from fairgang.spec import JobState

app = typer.Typer()

Since = typer.Option(None, "--since", help="From: epoch seconds or ISO 8601 (UTC unless it says).")
Until = typer.Option(None, "--until", help="Until: epoch seconds or ISO 8601 (default: now).")
TableCsvJson = typer.Option("table", "--output", "-o", help="table, csv or json.")
HISTORY_COLUMNS = (
    "id",
    "name",
    "tenant",
    "state",
    "gpus",
    "submitted",
    "started",
    "ended",
    "elapsed",
    "gpu_hours",
    "attempts",
    "exit_code",
)


def history_row(job: dict[str, Any]) -> dict[str, Any]:
    """A job as sacct shows it: when it was submitted, first ran and ended, how long it ran, its GPU-hours
    (its GPUs for that time), its attempts and exit code."""
    start, end = job.get("started_at"), job.get("finished_at")
    elapsed = (end - start) if start is not None and end is not None else None
    return {
        "id": job["id"],
        "name": job["name"],
        "tenant": job["tenant"],
        "state": job["state"],
        "gpus": f"{job['gpu_count']}x{job['gpu_type']}",
        "submitted": job["created_at"],
        "started": start,
        "ended": end,
        "elapsed": elapsed,
        "gpu_hours": None if elapsed is None else round(job["gpu_count"] * elapsed / 3600.0, 3),
        "attempts": job["attempt"],
        "exit_code": job.get("exit_code"),
    }


def _out(rows: list[dict[str, Any]], columns: tuple[str, ...], output: str, table: Table, cells: Any) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    elif output == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    elif output == "table":
        for row in rows:
            table.add_row(*cells(row))
        console.print(table)
    else:
        _fail(f"--output: '{output}' is not one of table, csv, json")


@app.command()
def history(
    since: str = Since,
    until: str = Until,
    state: JobState = typer.Option(None, "--state", help="Only jobs in this state."),
    tenant: str = typer.Option(None, "--tenant", help="Only this tenant's jobs (an admin's choice)."),
    label: list[str] = typer.Option([], "--label", "-l", help="key=value; repeat for several."),
    page_size: int = typer.Option(1000, "--page-size", help="Jobs asked for per request."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: str = TableCsvJson,
) -> None:
    """Jobs submitted in a time range, newest first, with start, end, elapsed time, GPU-hours and exit code (all
    of them: it follows the API's pages)."""
    chosen = {"since": since, "until": until, "state": state.value if state else None, "tenant": tenant}
    params: dict[str, Any] = {k: v for k, v in chosen.items() if v}
    if label:
        params["label"] = label
    rows: list[dict[str, Any]] = []
    with _client(api_url, token) as http:
        cursor = None
        while True:
            resp = http.get("/v1/jobs", params=params | {"limit": page_size} | ({"cursor": cursor} if cursor else {}))
            rows += [history_row(j) for j in _check(resp)]
            cursor = resp.headers.get("X-Next-Cursor")
            if not cursor:
                break
    table = Table("ID", "NAME", "TENANT", "STATE", "GPUS", "SUBMITTED", "STARTED", "ENDED", "ELAPSED", "GPU-H", "ATT", "EXIT")

    def cells(r: dict[str, Any]) -> list[str]:
        elapsed = "-" if r["elapsed"] is None else format_duration(r["elapsed"])
        return [r["id"], r["name"], r["tenant"], r["state"], r["gpus"], _date_time(r["submitted"]), _date_time(r["started"]),
                _date_time(r["ended"]), elapsed, "-" if r["gpu_hours"] is None else f"{r['gpu_hours']:.2f}", str(r["attempts"]),
                "" if r["exit_code"] is None else str(r["exit_code"])]  # fmt: skip

    _out(rows, HISTORY_COLUMNS, output, table, cells)


USAGE_COLUMNS = (
    "tenant", "gpu_type", "gpu_hours", "guaranteed_gpu_hours", "fleet_share", "jobs", "wait_p50_s", "wait_p90_s", "preemptions",
    "gpu_hours_lost",
)  # fmt: skip


@app.command()
def usage(
    since: str = Since,
    until: str = Until,
    by: str = typer.Option("tenant,gpu_type", "--by", help="Group by tenant, gpu_type, both (comma-separated) or '' for a total."),
    tenant: str = typer.Option(None, "--tenant", help="Only this tenant (an admin's choice)."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: str = TableCsvJson,
) -> None:
    """GPU-hours used against guaranteed, share of the fleet, jobs, median and p90 wait, preemptions and GPU-hours
    lost, per tenant and GPU type, over a time range (default: the last 7 days)."""
    params = {k: v for k, v in {"since": since, "until": until, "tenant": tenant}.items() if v} | {"by": by}
    with _client(api_url, token) as http:
        report = _check(http.get("/v1/usage", params=params))
    title = f"usage {_date_time(report['since'])} - {_date_time(report['until'])}"
    table = Table(
        "TENANT", "GPU TYPE", "GPU-H", "GUARANTEED", "FLEET", "JOBS", "WAIT P50", "WAIT P90", "PREEMPTED", "LOST GPU-H", title=title
    )

    def wait(value: float | None) -> str:
        return "-" if value is None else format_duration(value)

    def cells(r: dict[str, Any]) -> list[str]:
        share = "-" if r["fleet_share"] is None else f"{100 * r['fleet_share']:.1f} %"
        return [r["tenant"] or "(all)", r["gpu_type"] or "(all)", f"{r['gpu_hours']:.1f}", f"{r['guaranteed_gpu_hours']:.1f}",
                share, str(r["jobs"]), wait(r["wait_p50_s"]), wait(r["wait_p90_s"]), str(r["preemptions"]),
                f"{r['gpu_hours_lost']:.1f}"]  # fmt: skip

    _out(report["rows"], USAGE_COLUMNS, output, table, cells)
