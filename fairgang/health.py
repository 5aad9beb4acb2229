"""GPU health policy (SPEC R6.1, R9.1): what a GPU's health report means for the GPU and its node.

Pure: a report (the agent's per-GPU health dict, same keys for NVML and the simulated
backend) and the GPU's previous stored health in, findings out. The API applies them:
a fatal finding takes the GPU out of service and moves its job; a degraded one cordons
the node. See docs/architecture.md ("GPU health").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Keys of a health report (every one optional: a backend reports what it can read).
REPORT_KEYS = (
    "utilization_pct",
    "memory_used_mb",
    "memory_total_mb",
    "temperature_c",
    "xid_errors",
    "ecc_uncorrectable_volatile",
    "ecc_uncorrectable_aggregate",
    "ecc_correctable_volatile",
    "retired_pages",
    "remapped_rows_failed",
    "throttle_reasons",
)
#: Faults the simulated backend can inject (``POST /v1/nodes/{id}/gpus/{index}/faults``).
FAULT_KINDS = ("xid", "ecc_uncorrectable", "ecc_correctable", "retired_pages", "thermal", "power")


@dataclass(frozen=True)
class Thresholds:
    """From settings (``FAIRGANG_HEALTH_*``)."""

    fatal_xids: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 93, 94, 95})
    #: Consecutive heartbeats with thermal or power throttling before the node is cordoned.
    throttle_beats: int = 5
    #: A rise of correctable ECC errors by this many (since the last stored report) cordons the node.
    correctable_ecc_rise: int = 100
    #: This many retired (or failed remapped) pages take the GPU out.
    retired_pages_fatal: int = 60


@dataclass(frozen=True)
class Finding:
    #: "fatal" (GPU out, job moved) or "degraded" (node cordoned, long multi-node jobs move at their next checkpoint).
    severity: str
    #: The fault's kind, as in health events: xid, ecc_uncorrectable, retired_pages, thermal, power, ecc_correctable.
    kind: str
    message: str


def parse_xids(text: str) -> frozenset[int]:
    """``"48,63,92-95"`` -> {48, 63, 92, 93, 94, 95}."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.update(range(int(lo), int(hi) + 1))
        elif part:
            out.add(int(part))
    return frozenset(out)


def _int(report: dict[str, Any], key: str) -> int:
    value = report.get(key)
    return int(value) if isinstance(value, int | float) else 0


def assess(report: dict[str, Any], previous: dict[str, Any], thresholds: Thresholds) -> tuple[list[Finding], dict[str, Any]]:
    """The findings of one report, and the bookkeeping to store with it (consecutive throttled beats).

    Args:
        report: the agent's latest health of one GPU.
        previous: the GPU's stored health (the previous report plus bookkeeping).
        thresholds: the policy's thresholds.
    """
    findings = []
    fatal_xids = sorted({int(x) for x in report.get("xid_errors") or [] if int(x) in thresholds.fatal_xids})
    if fatal_xids:
        findings.append(Finding("fatal", "xid", "Xid " + ", ".join(str(x) for x in fatal_xids)))
    # Volatile (since the driver loaded): the aggregate count is lifetime and would condemn a GPU for ever.
    uncorrectable = _int(report, "ecc_uncorrectable_volatile")
    if uncorrectable > 0:
        findings.append(Finding("fatal", "ecc_uncorrectable", f"{uncorrectable} uncorrectable ECC error(s)"))
    pages = _int(report, "retired_pages") + _int(report, "remapped_rows_failed")
    if pages >= thresholds.retired_pages_fatal:
        findings.append(Finding("fatal", "retired_pages", f"{pages} retired or unremappable pages"))
    throttle = [r for r in report.get("throttle_reasons") or [] if r in ("thermal", "power")]
    beats = _int(previous, "throttled_beats") + 1 if throttle else 0
    if throttle and beats >= thresholds.throttle_beats:
        kind = "thermal" if "thermal" in throttle else "power"
        findings.append(Finding("degraded", kind, f"{kind} throttling for {beats} heartbeats"))
    rise = _int(report, "ecc_correctable_volatile") - _int(previous, "ecc_correctable_volatile")
    if "ecc_correctable_volatile" in previous and rise >= thresholds.correctable_ecc_rise:
        findings.append(Finding("degraded", "ecc_correctable", f"correctable ECC errors rose by {rise}"))
    return findings, {"throttled_beats": beats}


#: Keys of a simulated GPU's report that describe a fault: kept only while the store holds an injected one.
SIMULATED_FAULT_KEYS = ("xid_errors", "ecc_uncorrectable_volatile", "throttle_reasons")


def effective_report(report: dict[str, Any], *, fault_injected: bool) -> dict[str, Any]:
    """The report the policy judges. A simulated GPU fails only while the store holds an injected fault: a
    report in flight while an admin returned the GPU still carries the old fault, and must not take it out again."""
    if report.get("simulated") and not fault_injected:
        return {k: v for k, v in report.items() if k not in SIMULATED_FAULT_KEYS}
    return report


def takes_out(findings: list[Finding]) -> bool:
    """A fatal finding takes the GPU out of service (its jobs move)."""
    return any(f.severity == "fatal" for f in findings)


def cordons(findings: list[Finding], node_state: str) -> bool:
    """A degraded finding cordons a READY node (no new work; its long jobs move at their next checkpoint)."""
    return node_state == "READY" and any(f.severity == "degraded" for f in findings)


def moves_at_checkpoint(*, job_gpus: int, node_gpus: int, checkpoint_at: float | None, degraded_since: float) -> bool:
    """On a node cordoned for degradation, a job spanning more than the node moves once it has checkpointed
    since the cordon (R9.1); a job within the node keeps running to its end."""
    return job_gpus > node_gpus and (checkpoint_at or 0.0) > degraded_since
