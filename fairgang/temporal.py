"""Connecting to Temporal: one place for every part (API, placement service, workflow worker, agents)."""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client

from fairgang import metrics
from fairgang.settings import Settings

log = logging.getLogger("fairgang")


async def connect(settings: Settings) -> Client:
    """A client; with ``temporal_metrics_bind`` set, its workers export the SDK's metrics there (docs/metrics.md)."""
    runtime = metrics.temporal_runtime(settings.temporal_metrics_bind)
    return await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace, runtime=runtime)


async def connect_with_retry(settings: Settings, attempts: int = 60) -> Client:
    """A client, once Temporal answers (a part may start before it), trying once a second."""
    for attempt in range(attempts):
        try:
            return await connect(settings)
        except Exception as err:
            if attempt == attempts - 1:
                raise
            log.info("waiting for Temporal at %s: %s", settings.temporal_address, err)
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")
