"""Ports for the platforms the benchmarks and tests start: free, distinct, below the ephemeral range.

One platform needs several (API, Temporal, its UI, PostgreSQL, metrics). Each is checked free when it is
handed out, but nothing binds it until the servers start, so a port that is merely free could be handed
out twice (an API and a Temporal UI on one port: the API's readiness probe then reads the UI's page).
This process never hands out the same port twice, and each pytest-xdist worker (and the benchmarks it
runs as subprocesses, which inherit ``PYTEST_XDIST_WORKER``) draws from its own slice, so parallel
platforms never collide. The range lies below the kernel's ephemeral ports (32768 and up), which the
servers' own outgoing connections and random ports take.
"""

from __future__ import annotations

import os
import random
import socket

#: Ports handed out by this process.
_handed_out: set[int] = set()

_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
#: This worker's slice: 2,000 ports of 20000-31999.
PORTS = (20000 + 2000 * (_WORKER % 6), 20000 + 2000 * (_WORKER % 6) + 1999)


def free_port() -> int:
    """A port of this worker's slice that is free now and that this process has not handed out before."""
    low, high = PORTS
    for _ in range(20 * (high - low + 1)):
        port = random.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port left in {low}-{high}")
