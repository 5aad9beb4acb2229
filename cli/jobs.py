"""Job commands: ``submit``, ``jobs``, ``job``, ``logs``, ``cancel``, ``preempt``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from cli.kit import ApiUrl, Output, Token, console, err_console
from cli.kit import check as _check
from cli.kit import client as _client
from cli.kit import emit as _emit
from cli.kit import fail as _fail
from cli.kit import ts as _ts
from fairgang.durations import format_duration
from fairgang.spec import TERMINAL_STATES, SpecError, load_spec_text

app = typer.Typer()


def print_jobs(rows: list[dict[str, Any]]) -> None:
    table = Table("ID", "TENANT", "NAME", "STATE", "GPUS", "ATTEMPT", "EXIT", "CREATED", "WHY")
    for r in rows:
        why = r.get("pending_reason") or r.get("end_reason") or ""
        table.add_row(
            r["id"], r["tenant"], r["name"], r["state"], f"{r['gpu_count']}x{r['gpu_type']}", str(r["attempt"]),
            "" if r.get("exit_code") is None else str(r["exit_code"]), _ts(r["created_at"]), why,
        )  # fmt: skip
    console.print(table)


@app.command()
def submit(
    file: Path,
    wait: bool = typer.Option(False, "--wait", help="Wait until the job ends; exit 0 only if it SUCCEEDED."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: str = Output,
) -> None:
    """Submit a job spec (YAML or JSON)."""
    try:
        spec = load_spec_text(file.read_text())
    except OSError as err:
        _fail(f"{file}: {err}")
    except SpecError as err:
        lines = "\n".join(f"  {p.field}: {p.reason}" for p in err.problems)
        _fail(f"{file}: job spec refused:\n{lines}")
    with _client(api_url, token) as http:
        result = _check(http.post("/v1/jobs", json=spec.model_dump(mode="json", exclude_none=True)))
        job = result["job"]
        if output == "json" and not wait:
            _emit(result, output, None)
        else:
            verb = "submitted" if result["created"] else "already submitted"
            err_console.print(f"{verb}: {job['id']}")
        if not wait:
            if output != "json":
                console.print(job["id"])
            return
        terminal = {s.value for s in TERMINAL_STATES}
        while job["state"] not in terminal:
            time.sleep(1.0)
            job = _check(http.get(f"/v1/jobs/{job['id']}"))
        _emit(job, output, lambda j: print_jobs([j]))
        raise typer.Exit(0 if job["state"] == "SUCCEEDED" else 1)


@app.command()
def jobs(
    tenant: str = typer.Option(None, "--tenant"),
    state: str = typer.Option(None, "--state"),
    api_url: str = ApiUrl,
    token: str = Token,
    output: str = Output,
) -> None:
    """List jobs (yours, or all for an admin)."""
    params = {k: v for k, v in {"tenant": tenant, "state": state}.items() if v}
    with _client(api_url, token) as http:
        _emit(_check(http.get("/v1/jobs", params=params)), output, print_jobs)


@app.command()
def job(job_id: str, api_url: str = ApiUrl, token: str = Token, output: str = Output) -> None:
    """Show one job: state, attempts, allocation, events, pending reason."""
    with _client(api_url, token) as http:
        data = _check(http.get(f"/v1/jobs/{job_id}"))

    def show(j: dict[str, Any]) -> None:
        print_jobs([j])
        if j.get("allocation"):
            members = ", ".join(f"{m['node_id']}[{','.join(map(str, m['gpu_indices']))}]" for m in j["allocation"]["members"])
            console.print(f"allocation {j['allocation']['id']} ({j['allocation']['state']}): {members}")
        console.print(f"max runtime {format_duration(j['spec']['max_runtime'])}   temporal {j['temporal_url']}")
        events = Table("TIME", "ATTEMPT", "EVENT", "MESSAGE")
        for e in j["events"]:
            events.add_row(_ts(e["ts"]), str(e["attempt"]), e["kind"], e["message"])
        console.print(events)

    _emit(data, output, show)


@app.command()
def logs(
    job_id: str,
    attempt: int = typer.Option(None, "--attempt"),
    rank: int = typer.Option(0, "--rank"),
    tail: int = typer.Option(None, "--tail"),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Print a job attempt's log (stdout and stderr)."""
    params = {k: v for k, v in {"attempt": attempt, "rank": rank, "tail": tail}.items() if v is not None}
    with _client(api_url, token) as http:
        resp = http.get(f"/v1/jobs/{job_id}/logs", params=params)
        if resp.status_code >= 400:
            _check(resp)
        sys.stdout.write(resp.text)


@app.command()
def cancel(job_id: str, api_url: str = ApiUrl, token: str = Token) -> None:
    """Cancel a job (its processes get SIGTERM, then SIGKILL after the grace period)."""
    with _client(api_url, token) as http:
        data = _check(http.post(f"/v1/jobs/{job_id}/cancel"))
    console.print(f"cancel requested for {data['id']} (was {data['state']})")


@app.command()
def preempt(job_id: str, reason: str = typer.Option(None, "--reason"), api_url: str = ApiUrl, token: str = Token) -> None:
    """Preempt a running job: it checkpoints (SIGTERM, grace period), then queues again as the next attempt."""
    with _client(api_url, token) as http:
        data = _check(http.post(f"/v1/jobs/{job_id}/preempt", params={"reason": reason} if reason else {}))
    console.print(data["message"])
