#!/usr/bin/env python3
"""Run the node agent's NVML backend (worker_agent.gpus.NvmlGpus) on this machine and print what it reads.

Prints, per GPU: inventory (index, name, UUID, memory), temperature, utilisation, clock-throttle
reasons, ECC counters (uncorrectable volatile / aggregate, correctable volatile), retired pages,
remapped rows and critical Xid events: exactly the health report an agent sends in its heartbeats.

    .venv/bin/python scripts/nvml_probe.py                      # one reading, as tables
    .venv/bin/python scripts/nvml_probe.py --samples 5 --interval 2
    .venv/bin/python scripts/nvml_probe.py --json               # the raw reports

Exits 1 with one line on stderr when there is no NVML (no driver or no GPU), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker_agent.gpus import GpuInfo, NvmlGpus

NO_NVML = "nvml_probe: no NVML here"


def open_backend() -> NvmlGpus:
    """The agent's NVML backend; SystemExit(1) with one clear line when this machine has none."""
    try:
        import pynvml
    except ImportError:
        raise SystemExit(f"{NO_NVML}: nvidia-ml-py is not installed (pip install nvidia-ml-py)") from None
    try:
        backend = NvmlGpus()
    except pynvml.NVMLError as err:
        raise SystemExit(f"{NO_NVML} ({type(err).__name__}: {err}): no NVIDIA driver or GPU on this machine") from None
    if not backend._handles:
        raise SystemExit(f"{NO_NVML}: NVML answers but sees no GPU")
    return backend


def driver_info() -> dict[str, str]:
    import pynvml

    info = {"host": platform.node()}
    queries = {"driver": "nvmlSystemGetDriverVersion", "nvml": "nvmlSystemGetNVMLVersion", "cuda": "nvmlSystemGetCudaDriverVersion"}
    for key, fn in queries.items():
        try:
            value = getattr(pynvml, fn)()
        except (pynvml.NVMLError, AttributeError):
            continue
        if key == "cuda" and isinstance(value, int):
            value = f"{value // 1000}.{value % 1000 // 10}"
        info[key] = value.decode() if isinstance(value, bytes) else str(value)
    return info


def table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(values: list[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in cells)])


def render(gpus: list[GpuInfo], reports: dict[int, dict[str, Any]]) -> str:
    inventory = [[g.index, g.name, g.uuid, reports[g.index].get("memory_total_mb"), reports[g.index].get("memory_used_mb")] for g in gpus]
    sensors = []
    ecc = []
    for g in gpus:
        r = reports[g.index]
        sensors.append([g.index, r.get("temperature_c"), r.get("utilization_pct"), ",".join(r.get("throttle_reasons", [])) or "none"])
        ecc.append(
            [
                g.index,
                r.get("ecc_uncorrectable_volatile"),
                r.get("ecc_uncorrectable_aggregate"),
                r.get("ecc_correctable_volatile"),
                r.get("retired_pages"),
                r.get("remapped_rows_uncorrectable"),
                r.get("remapped_rows_failed"),
                ",".join(str(x) for x in r.get("xid_errors", [])) or "none",
            ]
        )
    ecc_headers = ["gpu", "ecc uncorr vol", "ecc uncorr agg", "ecc corr vol", "retired pages", "remap uncorr", "remap failed", "xid"]
    return "\n\n".join(
        [
            "Inventory\n" + table(["gpu", "name", "uuid", "mem total MiB", "mem used MiB"], inventory),
            "Temperature, utilisation, clock-throttle reasons\n" + table(["gpu", "temp C", "util %", "throttle reasons"], sensors),
            "ECC, retired pages, remapped rows, critical Xid events\n" + table(ecc_headers, ecc),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    parser.add_argument("--samples", type=int, default=1, help="readings to take (default 1)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between readings")
    parser.add_argument("--json", action="store_true", help="print the raw health reports as JSON lines")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    backend = open_backend()
    gpus = backend.inventory()
    info = driver_info()
    if not args.json:
        print(" ".join(f"{k}={v}" for k, v in info.items()) + f" gpus={len(gpus)} time={time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
    for sample in range(args.samples):
        if sample:
            time.sleep(args.interval)
        reports = backend.health(frozenset())
        if args.json:
            print(json.dumps({"sample": sample, **info, "gpus": [{**g.as_dict(), "health": reports[g.index]} for g in gpus]}))
        else:
            print(f"\n== sample {sample + 1} of {args.samples}\n\n{render(gpus, reports)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
