"""Admin commands: ``tenant set`` (a tenant's policy, live) and ``audit`` (who changed what, when)."""

from __future__ import annotations

import json
import time
from typing import Any

import typer
from rich.table import Table

from cli.kit import ApiUrl, Output, OutputFormat, Token, console
from cli.kit import check as _check
from cli.kit import client as _client
from cli.kit import emit as _emit
from cli.kit import fail as _fail

app = typer.Typer()
tenant_app = typer.Typer(help="Tenants' policies (admins).", no_args_is_help=True)
app.add_typer(tenant_app, name="tenant")


def _quota(item: str) -> tuple[str, dict[str, int] | None]:
    """``TYPE=NOMINAL[:BORROW[:LEND]]``, or ``TYPE=none`` to take the type away."""
    gpu_type, sep, value = item.partition("=")
    if not sep or not gpu_type:
        _fail(f"--quota: {item!r} is not TYPE=NOMINAL[:BORROW[:LEND]] or TYPE=none")
    if value == "none":
        return gpu_type, None
    parts = value.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        _fail(f"--quota: {item!r}: NOMINAL, BORROW and LEND are whole numbers")
    if len(numbers) > 3:
        _fail(f"--quota: {item!r} has more than NOMINAL:BORROW:LEND")
    return gpu_type, dict(zip(("nominal", "borrow_limit", "lend_limit"), numbers, strict=False))


@tenant_app.command("set")
def tenant_set(
    name: str,
    weight: float = typer.Option(None, "--weight"),
    cohort: str = typer.Option(None, "--cohort"),
    quota: list[str] = typer.Option([], "--quota", help="TYPE=NOMINAL[:BORROW[:LEND]], or TYPE=none (repeat)."),
    max_gpus_per_job: int = typer.Option(None, "--max-gpus-per-job"),
    max_runtime: str = typer.Option(None, "--max-runtime", help="e.g. 24h."),
    max_jobs: int = typer.Option(None, "--max-jobs", help="Most unfinished jobs at once."),
    rate: float = typer.Option(None, "--submissions-per-minute"),
    burst: int = typer.Option(None, "--submission-burst"),
    checkpoint_prefix: str = typer.Option(None, "--checkpoint-prefix"),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Change a tenant's policy now (the next scheduling cycle uses it); the change is audited."""
    body: dict[str, Any] = {
        "weight": weight, "cohort": cohort, "max_gpus_per_job": max_gpus_per_job, "max_runtime": max_runtime,
        "max_concurrent_jobs": max_jobs, "submissions_per_minute": rate, "submission_burst": burst,
        "checkpoint_prefix": checkpoint_prefix,
    }  # fmt: skip
    body = {k: v for k, v in body.items() if v is not None}
    if quota:
        body["quotas"] = dict(_quota(item) for item in quota)
    if not body:
        _fail("nothing to change: give at least one option (see --help)")
    with _client(api_url, token) as http:
        answer = _check(http.patch(f"/v1/tenants/{name}", json=body))
    changed = {k: (answer["before"][k], v) for k, v in answer["after"].items() if answer["before"][k] != v}
    for key, (old, new) in changed.items():
        console.print(f"{name}: {key} {json.dumps(old)} -> {json.dumps(new)}", markup=False, highlight=False)
    if not changed:
        console.print(f"{name}: unchanged")
    for warning in answer["warnings"]:
        console.print(f"warning: {warning}", markup=False, highlight=False)


def _audit_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("ID", "WHEN", "WHO", "WHAT", "TARGET", "CHANGE", title="Audit log")
    for e in rows:
        before, after = e["before"] or {}, e["after"] or {}
        change = ", ".join(
            f"{k}: {json.dumps(before.get(k))} -> {json.dumps(after.get(k))}" for k in after if before.get(k) != after.get(k)
        )
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at"]))
        table.add_row(str(e["id"]), when, e["actor"], e["action"], e["target"], change or "-")
    return table


@app.command("audit")
def audit(
    target: str = typer.Option(None, "--target", help="One thing's events, e.g. tenant:alpha."),
    limit: int = typer.Option(50, "--limit", min=1, max=1000),
    output: OutputFormat = Output,
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Admin: the audit log, newest first."""
    params: dict[str, Any] = {"limit": limit} | ({"target": target} if target else {})
    with _client(api_url, token) as http:
        rows = _check(http.get("/v1/audit", params=params))
    _emit(rows, output, lambda data: console.print(_audit_table(data)))
