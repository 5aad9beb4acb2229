"""What every `fairgang` client command shares: options, output, errors, the API client."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from enum import StrEnum
from typing import Any

import httpx
import typer
import yaml
from rich.console import Console

from fairgang.settings import Settings

#: Tables cut to the terminal's width; written to a pipe or a file they are whole (ids and times untruncated).
console = Console() if sys.stdout.isatty() else Console(width=100_000)
err_console = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=100_000)

ApiUrl = typer.Option(None, "--api", envvar="FAIRGANG_API_URL", help="API address.")
Token = typer.Option(None, "--token", envvar="FAIRGANG_TOKEN", help="Bearer token.")


#: What every listing command can print: a table (wide: every column, never cut), the API's JSON or YAML, or
#: only the ids (one a line, for scripts: `fairgang jobs -o name | xargs fairgang cancel`).
class OutputFormat(StrEnum):
    table = "table"
    wide = "wide"
    json = "json"
    yaml = "yaml"
    name = "name"


OUTPUTS = tuple(OutputFormat)
Output = typer.Option(OutputFormat.table, "--output", "-o", help="How to print it.")


def flag(*decls: str, **options: Any) -> Any:
    """A boolean option that is off unless given, shown in --help without a "<bool>" (it takes no value)."""
    return typer.Option(False, *decls, metavar="", **options)


def client(api_url: str | None, token: str | None) -> httpx.Client:
    """The API client: --api and --token (or their variables), else the current context's (cli/contexts.py)."""
    from cli import contexts  # imports this module

    settings = Settings()
    ctx = contexts.current() if not (api_url and token) else {}
    api_url, token = api_url or ctx.get("api"), token or ctx.get("token")
    if not token:
        fail("no token: pass --token, set FAIRGANG_TOKEN, or add a context (fairgang config set-context NAME --api URL --token T)")
    return httpx.Client(base_url=api_url or settings.api_url, headers={"Authorization": f"Bearer {token}"}, timeout=settings.cli_timeout_s)


def fail(message: str, code: int = 1) -> Any:
    err_console.print(f"[red]error:[/] {message}")
    raise typer.Exit(code)


def check(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        try:
            body = resp.json()
        except ValueError:
            body = {"detail": resp.text}
        if not isinstance(body, dict):
            body = {"detail": body}
        if body.get("problems"):  # an RFC 9457 problem that names fields
            lines = "\n".join(f"  {p['field']}: {p['reason']}" for p in body["problems"])
            fail(f"{body.get('detail', 'refused')} ({resp.status_code}):\n{lines}")
        fail(f"{resp.status_code}: {body.get('detail', resp.text)}")
    return resp.json() if resp.headers.get("content-type", "").startswith("application/json") else resp.text


def ts(value: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(value)) if value else "-"


def date_time(value: float | None) -> str:
    """A moment with its date, in local time and its zone: "2026-12-03 02:00 UTC"."""
    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(value)) if value else "-"


#: Between the two ends of an interval.
EN_DASH = "\u2013"


def start_window(low: float | None, median: float | None, high: float | None, now: float | None = None) -> str:
    """A predicted start with its interval, in local time: "14:30\u201316:10 UTC, most likely 15:05" (with dates when
    not all today; "now" for a time already come; "unknown" without a median: beyond the estimator's horizon)."""
    if median is None:
        return "unknown"
    now = time.time() if now is None else now
    known = [t for t in (low, median, high) if t is not None]
    today = time.strftime("%Y-%m-%d", time.localtime(now))
    same_day = all(time.strftime("%Y-%m-%d", time.localtime(t)) == today for t in known)
    fmt = "%H:%M" if same_day else "%Y-%m-%d %H:%M"

    def clock(t: float) -> str:
        return "now" if t <= now + 1 else time.strftime(fmt, time.localtime(t))

    zone = time.strftime("%Z", time.localtime(median))
    first = clock(low if low is not None else median)
    last = clock(high) if high is not None else None
    likely = clock(median)
    if last == first:
        return likely if likely == "now" else f"{likely} {zone}"
    if last is None:
        return f"{first} or later {zone}, most likely {likely}"
    return f"{first}{EN_DASH}{last} {zone}, most likely {likely}"


def emit(data: Any, output: str, table: Any, wide: Any = None) -> None:
    """Print ``data`` (the API's answer) as ``output`` asks: ``table`` and ``wide`` (``wide`` if given, else
    ``table``, on a console as wide as the rows) are callables that print it."""
    if output == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif output == "yaml":
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    elif output == "name":
        items = data if isinstance(data, list) else [data.get("job") or data.get("sweep") or data] if isinstance(data, dict) else []
        sys.stdout.write("".join(f"{item['id']}\n" for item in items if isinstance(item, dict) and "id" in item))
    elif output == "table":
        table(data)
    elif output == "wide":
        saved = console.width
        console.width = 100_000
        try:
            (wide or table)(data)
        finally:
            console.width = saved
    else:
        fail(f"--output: '{output}' is not one of {', '.join(OUTPUTS)}")


def setup_logging() -> None:
    """The long-running processes' log format; FAIRGANG_LOG_LEVEL sets the level."""
    logging.basicConfig(level=os.environ.get("FAIRGANG_LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
