"""Instrumentation of the view worker process for tests, steered by files in a directory.

``install(directory)`` runs in the worker (``api.views.WORKER_SETUP``) and wraps every view's
computation: it appends the time to ``NAME.started`` when one starts and to ``NAME.ended`` when
it ends, and the store version it computes to ``NAME.keys``; with ``NAME.fail`` present it
raises that file's text; with ``NAME.block`` present it blocks its thread (as a long simulation
does) until ``NAME.release`` appears, writing ``NAME.blocked`` meanwhile (``NAME.timed_out``
after 30 s); with ``NAME.sleep`` present it sleeps that many seconds after computing.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from api import views


def _note(path: Path, what: str | None = None) -> None:
    with path.open("a") as out:
        out.write(f"{time.time()!r}\n" if what is None else f"{what}\n")


def install(directory: str) -> None:
    where = Path(directory)
    for name, original in list(views.COMPUTE.items()):

        async def wrapped(r: views.Round, name: str = name, original: Any = original) -> Any:
            _note(where / f"{name}.started")
            _note(where / f"{name}.keys", ",".join(map(str, r.key)))
            fail = where / f"{name}.fail"
            if fail.exists():
                raise RuntimeError(fail.read_text())
            if (where / f"{name}.block").exists():
                (where / f"{name}.blocked").touch()
                deadline = time.monotonic() + 30
                while not (where / f"{name}.release").exists():
                    if time.monotonic() > deadline:
                        (where / f"{name}.timed_out").touch()
                        break
                    time.sleep(0.01)  # noqa: ASYNC251 - blocking the worker's loop is the point
            result = await original(r)
            sleep = where / f"{name}.sleep"
            if sleep.exists():
                await asyncio.sleep(float(sleep.read_text()))
            _note(where / f"{name}.ended")
            return result

        views.COMPUTE[name] = wrapped


def times(directory: Path, name: str, what: str) -> list[float]:
    """The times noted in ``NAME.started`` or ``NAME.ended``."""
    path = directory / f"{name}.{what}"
    return [float(line) for line in path.read_text().split()] if path.exists() else []


def keys(directory: Path, name: str) -> list[tuple[int, ...]]:
    """The store versions the view's computations computed, in order."""
    path = directory / f"{name}.keys"
    return [tuple(int(k) for k in line.split(",")) for line in path.read_text().split()] if path.exists() else []
