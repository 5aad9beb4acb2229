"""What every `fairgang` client command shares: options, output, errors, the API client."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

import httpx
import typer
from rich.console import Console

from fairgang.settings import Settings

#: Tables cut to the terminal's width; written to a pipe or a file they are whole (ids and times untruncated).
console = Console() if sys.stdout.isatty() else Console(width=100_000)
err_console = Console(stderr=True)

ApiUrl = typer.Option(None, "--api", envvar="FAIRGANG_API_URL", help="API address.")
Token = typer.Option(None, "--token", envvar="FAIRGANG_TOKEN", help="Bearer token.")
Output = typer.Option("table", "--output", "-o", help="table or json.")


def client(api_url: str | None, token: str | None) -> httpx.Client:
    settings = Settings()
    if not token:
        fail("no token: pass --token or set FAIRGANG_TOKEN")
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


def emit(data: Any, output: str, table: Any) -> None:
    if output == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif output == "table":
        table(data)
    else:
        fail(f"--output: '{output}' is not one of table, json")


def setup_logging() -> None:
    """The long-running processes' log format; FAIRGANG_LOG_LEVEL sets the level."""
    logging.basicConfig(level=os.environ.get("FAIRGANG_LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
