"""The ports the test and benchmark platforms draw: free, distinct, in this worker's slice below the ephemeral range."""

from __future__ import annotations

import socket

from benchmarks.ports import PORTS, free_port


def test_ports_handed_out_are_never_handed_out_again_and_stay_in_the_workers_slice() -> None:
    # 400 draws of a 2,000-port slice: with repeats allowed, some would come twice (the birthday bound),
    # as an API and a Temporal UI once got one port and the API's readiness probe read the UI's page.
    ports = [free_port() for _ in range(400)]
    assert len(set(ports)) == len(ports)
    low, high = PORTS
    assert all(low <= p <= high < 32768 for p in ports)


def test_a_port_in_use_is_not_handed_out() -> None:
    low = PORTS[0]
    taken = []
    try:
        for port in range(low, low + 200):
            sock = socket.socket()
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            taken.append(sock)
        busy = {s.getsockname()[1] for s in taken}
        assert not busy & {free_port() for _ in range(200)}
    finally:
        for sock in taken:
            sock.close()
