"""Contexts, as kubectl's: named pairs of API address and token in a config file, one of them current.

The file is ``$FAIRGANG_CONFIG`` or ``~/.config/fairgang/config.yaml`` (``$XDG_CONFIG_HOME`` if set), mode 0600:

    current-context: prod
    contexts:
      prod: {api: https://fairgang.example.com, token: fgt-...}
      dev: {api: http://127.0.0.1:8080, token: vision-dev-token}

A command's ``--api`` and ``--token`` (or ``FAIRGANG_API_URL`` and ``FAIRGANG_TOKEN``) win over the current
context; ``FAIRGANG_CONTEXT=NAME`` picks another for one command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.table import Table

from cli.kit import console, fail

app = typer.Typer(help="Contexts: named API addresses and tokens (kubectl's habit).", no_args_is_help=True)


def config_path() -> Path:
    if os.environ.get("FAIRGANG_CONFIG"):
        return Path(os.environ["FAIRGANG_CONFIG"])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "fairgang" / "config.yaml"


def load() -> dict[str, Any]:
    path = config_path()
    if not path.exists():
        return {"contexts": {}}
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        fail(f"{path}: {err}")
    if not isinstance(data, dict) or not isinstance(data.get("contexts", {}), dict):
        fail(f"{path}: not a fairgang config (contexts: a mapping of names to api and token)")
    data.setdefault("contexts", {})
    return data


def save(data: dict[str, Any]) -> None:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds tokens
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    tmp.replace(path)


def current(name: str | None = None) -> dict[str, Any]:
    """The context to use: ``name``, else FAIRGANG_CONTEXT, else the file's current one ({} if none)."""
    data = load()
    name = name or os.environ.get("FAIRGANG_CONTEXT") or data.get("current-context")
    if not name:
        return {}
    found = data["contexts"].get(name)
    if found is None:
        fail(f"context '{name}' is not in {config_path()} (fairgang config get-contexts lists them)")
    return dict(found)


@app.command("set-context")
def set_context(
    name: str,
    api: str = typer.Option(None, "--api", help="The API's address."),
    token: str = typer.Option(None, "--token", help="The bearer token."),
) -> None:
    """Add a context, or change its address or token."""
    data = load()
    ctx = data["contexts"].get(name, {}) | {k: v for k, v in {"api": api, "token": token}.items() if v}
    if not ctx.get("api"):
        fail("--api: a new context needs the API's address")
    data["contexts"][name] = ctx
    data.setdefault("current-context", name)
    save(data)
    console.print(f"context {name}: {ctx['api']}")


@app.command("use-context")
def use_context(name: str) -> None:
    """Make a context the current one."""
    data = load()
    if name not in data["contexts"]:
        fail(f"no context '{name}' (fairgang config get-contexts lists them)")
    data["current-context"] = name
    save(data)
    console.print(f"current context: {name}")


@app.command("get-contexts")
def get_contexts() -> None:
    """List the contexts; * marks the current one."""
    data = load()
    table = Table("", "NAME", "API", "TOKEN")
    for name, ctx in sorted(data["contexts"].items()):
        token = ctx.get("token") or ""
        table.add_row("*" if name == data.get("current-context") else "", name, ctx.get("api", ""), f"{token[:6]}..." if token else "-")
    console.print(table)


@app.command("delete-context")
def delete_context(name: str) -> None:
    """Remove a context."""
    data = load()
    if data["contexts"].pop(name, None) is None:
        fail(f"no context '{name}'")
    if data.get("current-context") == name:
        data.pop("current-context")
    save(data)
    console.print(f"deleted context {name}")
