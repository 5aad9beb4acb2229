"""Job commands: ``submit``, ``jobs``, ``job``, ``logs``, ``cancel``, ``hold``, ``release``, ``update``, ``preempt``."""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.live import Live
from rich.table import Table

from cli.kit import ApiUrl, Output, OutputFormat, Token, console, err_console, flag, start_window
from cli.kit import check as _check
from cli.kit import client as _client
from cli.kit import date_time as _date_time
from cli.kit import emit as _emit
from cli.kit import fail as _fail
from cli.kit import ts as _ts
from fairgang.durations import format_duration
from fairgang.spec import TERMINAL_STATES, JobState, SpecError, SpecProblem, load_spec_text

app = typer.Typer()


def _jobs_table(rows: list[dict[str, Any]], wide: bool = False) -> Table:
    columns = ["ID", "TENANT", "NAME", "STATE", "GPUS", "ATTEMPT", "EXIT", "CREATED", "WHY"]
    table = Table(*columns, *(["STARTED", "ENDED", "LABELS", "CHECKPOINT"] if wide else []))
    for r in rows:
        why = r.get("pending_reason") or r.get("end_reason") or ""
        cells = [r["id"], r["tenant"], r["name"], r["state"], gpus_cell(r), str(r["attempt"]),
                 "" if r.get("exit_code") is None else str(r["exit_code"]), _ts(r["created_at"]), why]  # fmt: skip
        if wide:
            labels = ",".join(f"{k}={v}" for k, v in sorted((r.get("spec", {}).get("labels") or {}).items()))
            cells += [_date_time(r.get("started_at")), _date_time(r.get("finished_at")), labels, r.get("latest_checkpoint") or ""]
        table.add_row(*cells)
    return table


def gpus_cell(job: dict[str, Any]) -> str:
    """ "8xH100" for a fixed job; an elastic one's range, and its size now when known: "16 of 8-32xH100"."""
    count = str(job["gpu_count"]) if not job.get("gpu_max") else f"{job['gpu_count']}-{job['gpu_max']}"
    now = job.get("gpus_now")
    return f"{now} of {count}x{job['gpu_type']}" if job.get("gpu_max") and now is not None else f"{count}x{job['gpu_type']}"


def print_jobs(rows: list[dict[str, Any]], wide: bool = False) -> None:
    console.print(_jobs_table(rows, wide))


def _overridden(spec: dict[str, Any], overrides: dict[str, Any], env: list[str], generate_name: bool) -> dict[str, Any]:
    """The spec with sbatch-like overrides applied (and a fresh name, as kubectl's generateName)."""
    spec = spec | {k: v for k, v in overrides.items() if v is not None}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--env: '{item}' is not KEY=VALUE")
        spec["env"] = dict(spec.get("env") or {}) | {key: value}
    if generate_name:
        spec["name"] = f"{spec['name'][:57]}-{secrets.token_hex(3)}"
    return spec


def _wait_line(job: dict[str, Any]) -> str:
    """What a waiting submitter wants to see: state, attempt, place in the queue and predicted start, why."""
    parts = [job["state"], f"attempt {job['attempt']}"]
    if job.get("queue_position"):
        parts.append(f"position {job['queue_position']}")
    if job.get("estimated_start"):
        parts.append(f"starts {start_window(job.get('estimated_start_low'), job['estimated_start'], job.get('estimated_start_high'))}")
    if job.get("pending_reason"):
        parts.append(job["pending_reason"])
    return "  ".join(parts)


@app.command()
def submit(
    file: Path,
    wait: bool = flag(
        "--wait", help="Wait until the job ends, showing its state as it changes, then its log; exit 0 only if it SUCCEEDED."
    ),
    name: str = typer.Option(None, "--name", help="Instead of the spec's name."),
    generate_name: bool = flag("--generate-name", help="Add a fresh suffix to the name: the same file submits a new job each time."),
    gpus: int = typer.Option(None, "--gpus", help="Instead of the spec's gpu_count."),
    gpu_type: str = typer.Option(None, "--gpu-type", help="Instead of the spec's gpu_type."),
    max_time: str = typer.Option(None, "--time", help="Instead of the spec's max_runtime, e.g. 2h."),
    env: list[str] = typer.Option([], "--env", help="KEY=VALUE added to the spec's env; repeat for several."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: OutputFormat = Output,
) -> None:
    """Submit a job spec (YAML or JSON). A job of the same name is the same job: submitting it again answers it as
    it is (use --name or --generate-name for another)."""
    try:
        text = file.read_text()
        raw = yaml.safe_load(text)
        if not isinstance(raw, dict):
            raise SpecError([SpecProblem(field="(spec)", reason="must be a mapping")])
        overrides = {"name": name, "gpu_count": gpus, "gpu_type": gpu_type, "max_runtime": max_time}
        spec = load_spec_text(json.dumps(_overridden(raw, overrides, env, generate_name)))
    except OSError as err:
        _fail(f"{file}: {err}")
    except yaml.YAMLError as err:
        _fail(f"{file}: not YAML or JSON: {err}")
    except SpecError as err:
        lines = "\n".join(f"  {p.field}: {p.reason}" for p in err.problems)
        _fail(f"{file}: job spec refused:\n{lines}")
    with _client(api_url, token) as http:
        result = _check(http.post("/v1/jobs", json=spec.model_dump(mode="json", exclude_none=True)))
        job = result["job"]
        if output in ("json", "yaml") and not wait:
            _emit(result, output, None)
        else:
            verb = "submitted" if result["created"] else "already submitted (the same name: --generate-name submits another)"
            err_console.print(f"{verb}: {job['id']}")
        if not wait:
            if output not in ("json", "yaml"):
                console.print(job["id"])
            return
        terminal = {s.value for s in TERMINAL_STATES}
        shown = ""
        while True:
            job = _check(http.get(f"/v1/jobs/{job['id']}"))
            line = _wait_line(job)
            if line != shown:
                err_console.print(f"{_ts(time.time())} {line}", highlight=False)
                shown = line
            if job["state"] in terminal:
                break
            time.sleep(1.0)
        _emit(job, output, lambda j: print_jobs([j]))
        if output in ("table", "wide"):
            log = http.get(f"/v1/jobs/{job['id']}/logs", params={"attempt": job["attempt"]})
            if log.status_code == 200 and log.text:
                err_console.print(f"--- log of attempt {job['attempt']}, rank 0", highlight=False)
                sys.stdout.write(log.text)
        raise typer.Exit(0 if job["state"] == "SUCCEEDED" else 1)


def _job_list(http: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every job the filters match (through the API's pages)."""
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        resp = http.get("/v1/jobs", params=params | {"limit": 1000} | ({"cursor": cursor} if cursor else {}))
        rows += _check(resp)
        cursor = resp.headers.get("X-Next-Cursor")
        if not cursor:
            return rows


State = typer.Option(None, "--state", help="Only jobs in this state.")
Labels = typer.Option([], "--selector", "-l", help="key=value a job's labels must hold; repeat for several.")


@app.command()
def jobs(
    tenant: str = typer.Option(None, "--tenant"),
    state: JobState = State,
    label: list[str] = Labels,
    search: str = typer.Option(None, "--search", "-s", help="A job id, or a part of the job's name (any case)."),
    watch: bool = flag("--watch", "-w", help="Show the list again every 2 s until Ctrl-C."),
    limit: int = typer.Option(200, "--limit", help="At most this many (newest first)."),
    api_url: str = ApiUrl,
    token: str = Token,
    output: OutputFormat = Output,
) -> None:
    """List jobs (yours, or all for an admin), newest first."""
    wanted = {"tenant": tenant, "state": state.value if state else None, "search": search}
    params: dict[str, Any] = {k: v for k, v in wanted.items() if v}
    params |= {"label": label, "limit": limit} if label else {"limit": limit}
    with _client(api_url, token) as http:
        if not watch:
            _emit(_check(http.get("/v1/jobs", params=params)), output, print_jobs, lambda rows: print_jobs(rows, wide=True))
            return
        with Live(console=console, auto_refresh=False) as live:
            try:
                while True:
                    rows = _check(http.get("/v1/jobs", params=params))
                    live.update(_jobs_table(rows, wide=output == "wide"), refresh=True)
                    time.sleep(2.0)
            except KeyboardInterrupt:
                return


@app.command()
def job(job_id: str, api_url: str = ApiUrl, token: str = Token, output: OutputFormat = Output) -> None:
    """Show one job: state, attempts, allocation, events, pending reason."""
    with _client(api_url, token) as http:
        data = _check(http.get(f"/v1/jobs/{job_id}"))

    def show(j: dict[str, Any]) -> None:
        print_jobs([j])
        if j.get("allocation"):
            members = ", ".join(f"{m['node_id']}[{','.join(map(str, m['gpu_indices']))}]" for m in j["allocation"]["members"])
            console.print(f"allocation {j['allocation']['id']} ({j['allocation']['state']}): {members}")
        if j.get("queue_position"):
            window = start_window(j.get("estimated_start_low"), j.get("estimated_start"), j.get("estimated_start_high"))
            console.print(f"queue position {j['queue_position']}, starts {window}")
        console.print(f"max runtime {format_duration(j['spec']['max_runtime'])}   temporal {j['temporal_url']}")
        events = Table("TIME", "ATTEMPT", "EVENT", "MESSAGE")
        for e in j["events"]:
            events.add_row(_ts(e["ts"]), str(e["attempt"]), e["kind"], e["message"])
        console.print(events)

    _emit(data, output, show)


@app.command()
def logs(
    job_id: str,
    attempt: int = typer.Option(None, "--attempt", help="Default: the latest."),
    rank: int = typer.Option(0, "--rank"),
    tail: int = typer.Option(None, "--tail", help="Only the last N lines."),
    follow: bool = flag("--follow", "-f", help="Keep printing what is written, across attempts, until the job ends."),
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
        sys.stdout.flush()
        if not follow:
            return
        terminal = {s.value for s in TERMINAL_STATES}
        current = attempt or int(_check(http.get(f"/v1/jobs/{job_id}"))["attempt"])
        offset = int(resp.headers.get("X-Log-Size", "0"))
        try:
            while True:
                job = _check(http.get(f"/v1/jobs/{job_id}"))
                chunk = http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": current, "rank": rank, "offset": offset})
                if chunk.status_code == 200 and chunk.text:
                    sys.stdout.write(chunk.text)
                    sys.stdout.flush()
                    offset = int(chunk.headers.get("X-Log-Size", offset))
                    continue  # more may be there already
                if job["attempt"] > current and attempt is None:
                    current, offset = current + 1, 0
                    err_console.print(f"--- attempt {current}", highlight=False)
                    continue
                if job["state"] in terminal:
                    return
                time.sleep(1.0)
        except KeyboardInterrupt:
            return


@app.command()
def cancel(
    job_ids: list[str] = typer.Argument(None, help="Job ids (or none, with --selector)."),
    label: list[str] = Labels,
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Cancel jobs (their processes get SIGTERM, then SIGKILL after the grace period): by id, or every job not ended
    whose labels match --selector. Exit status 1 if any could not be cancelled."""
    if not job_ids and not label:
        _fail("name the jobs to cancel, or select them with -l key=value")
    with _client(api_url, token) as http:
        targets = list(job_ids or [])
        if label:
            ended = {s.value for s in TERMINAL_STATES}
            targets += [j["id"] for j in _job_list(http, {"label": label}) if j["state"] not in ended and j["id"] not in targets]
            if not targets:
                err_console.print("no job that has not ended matches the selector")
    _each(
        targets, lambda http, job_id: http.post(f"/v1/jobs/{job_id}/cancel"), api_url, token, said="cancel requested for {id} (was {state})"
    )


def _each(job_ids: list[str], call: Any, api_url: str, token: str, said: str = "{id}: {state}") -> None:
    """Call ``call(http, job_id)`` for each id; print ``said`` of each job answered; exit 1 if any was refused."""
    failed = 0
    with _client(api_url, token) as http:
        for job_id in job_ids:
            resp = call(http, job_id)
            if resp.status_code >= 400:
                failed += 1
                body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {"detail": resp.text}
                err_console.print(f"[red]error:[/] {job_id}: {resp.status_code}: {body.get('detail', body)}")
                continue
            data = resp.json()
            console.print(said.format(id=data["id"], state=data["state"]))
    if failed:
        raise typer.Exit(1)


@app.command()
def hold(job_ids: list[str], api_url: str = ApiUrl, token: str = Token) -> None:
    """Keep queued jobs from placement until they are released (Slurm's scontrol hold)."""
    _each(job_ids, lambda http, job_id: http.post(f"/v1/jobs/{job_id}/hold"), api_url, token)


@app.command()
def release(job_ids: list[str], api_url: str = ApiUrl, token: str = Token) -> None:
    """Let held jobs be placed again, in their place in the queue."""
    _each(job_ids, lambda http, job_id: http.post(f"/v1/jobs/{job_id}/release"), api_url, token)


@app.command()
def update(
    job_ids: list[str],
    priority_class: str = typer.Option(None, "--priority-class", help="A lower class: low, normal or high."),
    max_time: str = typer.Option(None, "--time", help="A shorter max runtime, e.g. 30m."),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Lower a queued or held job's priority class or shorten its max runtime."""
    body = {k: v for k, v in {"priority_class": priority_class, "max_runtime": max_time}.items() if v is not None}
    if not body:
        _fail("nothing to change: give --priority-class or --time")
    _each(job_ids, lambda http, job_id: http.patch(f"/v1/jobs/{job_id}", json=body), api_url, token)


@app.command()
def preempt(job_id: str, reason: str = typer.Option(None, "--reason"), api_url: str = ApiUrl, token: str = Token) -> None:
    """Preempt a running job: it checkpoints (SIGTERM, grace period), then queues again as the next attempt."""
    with _client(api_url, token) as http:
        data = _check(http.post(f"/v1/jobs/{job_id}/preempt", params={"reason": reason} if reason else {}))
    console.print(data["message"])
