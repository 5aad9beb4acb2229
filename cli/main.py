"""The ``fairgang`` command: run the platform's processes, and use it as a client.

Each group of commands lives in its own module (serve, dev, jobs, fleet, sweeps); this one joins them.
"""

from __future__ import annotations

import httpx
import typer

from cli import accounting, admin, contexts, dev, fleet, jobs, serve, tokens, whatif
from cli.kit import err_console
from cli.sweeps import schedule_app, sweep_app
from simulator.cli import sim

app = typer.Typer(help="fairgang: fair gang scheduling for a shared GPU fleet.", no_args_is_help=True)
for group in (serve, dev, jobs, accounting, fleet, admin, whatif):
    app.add_typer(group.app)
sim_app = typer.Typer()
sim_app.command(name="sim")(sim)
app.add_typer(sim_app)
app.add_typer(sweep_app, name="sweep")
app.add_typer(schedule_app, name="schedule")
app.add_typer(tokens.app, name="token")
app.add_typer(contexts.app, name="config")


def main() -> None:
    """The `fairgang` command: the Typer app, with an unreachable or silent API reported in one line."""
    try:
        app()
    except httpx.TimeoutException as err:
        err_console.print(f"[red]error:[/] the API at {err.request.url.host}:{err.request.url.port} did not answer in time ({err!r})")
        raise SystemExit(1) from None
    except httpx.TransportError as err:
        where = f" at {err.request.url.scheme}://{err.request.url.host}:{err.request.url.port}" if err._request is not None else ""
        err_console.print(f"[red]error:[/] cannot reach the API{where}: {err}")
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
