"""``fairgang whatif``: how waits and ETAs would shift with a proposed change (admins; nothing is changed)."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from cli.kit import ApiUrl, Output, OutputFormat, Token, console, flag
from cli.kit import check as _check
from cli.kit import client as _client
from cli.kit import date_time as _date_time
from cli.kit import emit as _emit
from cli.kit import fail as _fail
from fairgang.durations import format_duration

app = typer.Typer()
#: The least time the command waits for the answer: two replays of a large fleet take a while.
TIMEOUT_S = 300.0


def _pair(option: str, item: str, shape: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip() or not value.strip():
        _fail(f"{option}: {item!r} is not {shape}")
    return key.strip(), value.strip()


def parse_weight(item: str) -> tuple[str, float]:
    """``TENANT=WEIGHT``."""
    tenant, value = _pair("--weight", item, "TENANT=WEIGHT")
    try:
        return tenant, float(value)
    except ValueError:
        return _fail(f"--weight: {item!r}: WEIGHT is a number")


def parse_quota(item: str) -> tuple[str, str, dict[str, int] | None]:
    """``TENANT:TYPE=NOMINAL[:BORROW[:LEND]]``, or ``TENANT:TYPE=none`` (the type taken away)."""
    shape = "TENANT:TYPE=NOMINAL[:BORROW[:LEND]] or TENANT:TYPE=none"
    key, value = _pair("--quota", item, shape)
    tenant, sep, gpu_type = key.partition(":")
    if not sep or not tenant or not gpu_type:
        _fail(f"--quota: {item!r} is not {shape}")
    if value == "none":
        return tenant, gpu_type, None
    try:
        numbers = [int(p) for p in value.split(":")]
    except ValueError:
        return _fail(f"--quota: {item!r}: NOMINAL, BORROW and LEND are whole numbers")
    if len(numbers) > 3:
        _fail(f"--quota: {item!r} has more than NOMINAL:BORROW:LEND")
    return tenant, gpu_type, dict(zip(("nominal", "borrow_limit", "lend_limit"), numbers, strict=False))


def parse_nodes(item: str) -> dict[str, Any]:
    """``COUNTxTYPE:GPUS[@LEVEL=DOMAIN[,LEVEL=DOMAIN]]``, e.g. ``2xH100-80GB:8@leaf=l1``."""
    shape = "COUNTxTYPE:GPUS[@LEVEL=DOMAIN,...], e.g. 2xH100-80GB:8@leaf=l1"
    what, _, where = item.partition("@")
    count, sep, rest = what.partition("x")
    gpu_type, sep2, gpus = rest.rpartition(":")
    if not sep or not sep2 or not gpu_type:
        _fail(f"--add: {item!r} is not {shape}")
    try:
        group: dict[str, Any] = {"count": int(count), "gpu_type": gpu_type, "gpus": int(gpus)}
    except ValueError:
        return _fail(f"--add: {item!r}: COUNT and GPUS are whole numbers ({shape})")
    group["domain"] = dict(_pair("--add", part, "LEVEL=DOMAIN") for part in where.split(",")) if where else {}
    return group


def parse_setting(item: str) -> tuple[str, str]:
    """``NAME=VALUE`` (the API checks NAME and VALUE's type)."""
    return _pair("--set", item, "NAME=VALUE")


def _duration(seconds: float) -> str:
    """A duration to the second, or to the minute from an hour on."""
    return format_duration(round(seconds / 60) * 60 if seconds >= 3600 else seconds)


def _wait(seconds: float, censored: bool) -> str:
    return ("≥" if censored else "") + _duration(seconds)


def _change(before: float, after: float) -> str:
    delta = after - before
    if abs(delta) < 1:
        return "="
    return ("+" if delta > 0 else "-") + _duration(abs(delta))


def _shift(before: float, after: float, censored: tuple[bool, bool]) -> str:
    """``before → after (change)``; ``≥`` marks a wait that counts jobs not started within the horizon."""
    return f"{_wait(before, censored[0])} → {_wait(after, censored[1])} ({_change(before, after)})"


def _tenants_table(answer: dict[str, Any]) -> Table:
    horizon = answer["horizon_s"]
    hours = f"{horizon / 3600:g}h"
    table = Table(
        "TENANT", "WAITING", "MEAN WAIT", "MEDIAN WAIT", f"STARTING WITHIN {hours}",
        title=f"Waits from now, without → with the change, next {hours} (≥: some start later)",
    )  # fmt: skip
    for t in answer["tenants"]:
        late = (t["started_before"] < t["waiting"], t["started_after"] < t["waiting"])
        median_late = (t["median_wait_before_s"] >= horizon, t["median_wait_after_s"] >= horizon)
        table.add_row(
            "(all)" if t["tenant"] == "*" else t["tenant"], str(t["waiting"]),
            _shift(t["mean_wait_before_s"], t["mean_wait_after_s"], late),
            _shift(t["median_wait_before_s"], t["median_wait_after_s"], median_late),
            f"{t['started_before']} → {t['started_after']}",
        )  # fmt: skip
    return table


def _jobs_table(answer: dict[str, Any]) -> Table:
    table = Table("JOB", "TENANT", "GPUS", "ETA WITHOUT", "ETA WITH", "SHIFT", title="Waiting jobs")
    for j in answer["jobs"] or []:
        if j["shift_s"] is not None:
            shift = _change(j["before"], j["after"])
        elif j["before"] is None and j["after"] is None:
            shift = "-"
        else:
            shift = "starts within the horizon" if j["before"] is None else "no longer within the horizon"
        table.add_row(
            j["job_id"], j["tenant"], f"{j['gpu_count']}x{j['gpu_type']}",
            _date_time(j["before"]) if j["before"] is not None else "later", _date_time(j["after"]) if j["after"] is not None else "later",
            shift,
        )  # fmt: skip
    return table


@app.command("whatif")
def whatif(
    weight: list[str] = typer.Option([], "--weight", help="TENANT=WEIGHT (repeat)."),
    quota: list[str] = typer.Option([], "--quota", help="TENANT:TYPE=NOMINAL[:BORROW[:LEND]], or TENANT:TYPE=none (repeat)."),
    add: list[str] = typer.Option([], "--add", help="Nodes added: COUNTxTYPE:GPUS[@LEVEL=DOMAIN,...] (repeat)."),
    drain: list[str] = typer.Option([], "--drain", help="A node that gets no new work (repeat)."),
    setting: list[str] = typer.Option([], "--set", help="A policy setting: NAME=VALUE, e.g. aging_per_hour=20 (repeat)."),
    hours: float = typer.Option(24.0, "--hours", help="How far ahead to replay."),
    jobs: bool = flag("--jobs", help="Also each waiting job's ETA without and with the change."),
    output: OutputFormat = Output,
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Admin: how waits and ETAs would shift per tenant with a change, replayed on the live queue (nothing changes).

    The next hours are replayed through the scheduler twice, without and with the change, from the queue, the
    running jobs and the fleet as they are now, with no new arrivals and the queue view's expected run times.
    """
    quotas: dict[str, dict[str, Any]] = {}
    for item in quota:
        tenant, gpu_type, q = parse_quota(item)
        quotas.setdefault(tenant, {})[gpu_type] = q
    body: dict[str, Any] = {
        "hours": hours,
        "weights": dict(parse_weight(item) for item in weight),
        "quotas": quotas,
        "add_nodes": [parse_nodes(item) for item in add],
        "drain": list(drain),
        "policy": dict(parse_setting(item) for item in setting),
        "jobs": jobs,
    }
    with _client(api_url, token) as http:
        answer = _check(http.post("/v1/admin/whatif", json=body, timeout=max(http.timeout.read or 0.0, TIMEOUT_S)))

    def show(data: dict[str, Any]) -> None:
        for line in data["changes"]:
            console.print(f"change: {line}", markup=False, highlight=False)
        console.print(_tenants_table(data))
        if jobs:
            console.print(_jobs_table(data))

    _emit(answer, output, show)
