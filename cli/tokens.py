"""Token commands: ``token create | ls | revoke`` (platform admins, and tenant admins for their own tenant)."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from cli.kit import ApiUrl, Output, OutputFormat, Token, console, date_time
from cli.kit import check as _check
from cli.kit import client as _client
from cli.kit import emit as _emit

app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)


def _tokens_table(rows: list[dict[str, Any]]) -> Table:
    table = Table("ID", "NAME", "ROLE", "TENANT", "CREATED", "BY", "EXPIRES", "REVOKED", title="Tokens")
    for t in rows:
        table.add_row(
            str(t["id"]), t["name"] or "-", t["role"], t["tenant"] or "-", date_time(t["created_at"]), t["created_by"] or "-",
            date_time(t["expires_at"]) if t["expires_at"] else "never", date_time(t["revoked_at"]) if t["revoked_at"] else "-",
        )  # fmt: skip
    return table


@app.command("create")
def token_create(
    name: str,
    role: str = typer.Option("tenant", "--role", help="tenant (a member), tenant_admin or admin."),
    tenant: str = typer.Option(None, "--tenant", help="Its tenant (a tenant admin's own by default)."),
    expires: str = typer.Option(None, "--expires", help="How long it works, e.g. 30d (default: until revoked)."),
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """Make a token and print its secret, once."""
    body = {"name": name, "role": role, "tenant": tenant, "expires_in": expires}
    with _client(api_url, token) as http:
        answer = _check(http.post("/v1/tokens", json={k: v for k, v in body.items() if v is not None}))
    info = answer["info"]
    console.print(f"token {info['id']} ({info['role']}{', ' + info['tenant'] if info['tenant'] else ''}) made; its secret (shown once):")
    console.print(answer["token"], markup=False, highlight=False)


@app.command("ls")
def token_ls(
    tenant: str = typer.Option(None, "--tenant", help="Admins: one tenant's only."),
    output: OutputFormat = Output,
    api_url: str = ApiUrl,
    token: str = Token,
) -> None:
    """People's tokens (never their secrets)."""
    with _client(api_url, token) as http:
        rows = _check(http.get("/v1/tokens", params={"tenant": tenant} if tenant else {}))
    _emit(rows, output, lambda data: console.print(_tokens_table(data)))


@app.command("revoke")
def token_revoke(token_id: int, api_url: str = ApiUrl, token: str = Token) -> None:
    """Revoke a token: refused from now on."""
    with _client(api_url, token) as http:
        info = _check(http.delete(f"/v1/tokens/{token_id}"))
    console.print(f"token {info['id']} revoked")
