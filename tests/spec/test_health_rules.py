"""The health policy's decisions beyond one report's findings (fairgang.health): which report is judged,
what takes a GPU out, what cordons a node, and when a long job moves off a degraded node."""

from __future__ import annotations

from fairgang.health import Finding, cordons, effective_report, moves_at_checkpoint, takes_out

FATAL = Finding(kind="xid", severity="fatal", message="Xid 79")
DEGRADED = Finding(kind="thermal", severity="degraded", message="throttling")


def test_a_simulated_gpus_fault_counts_only_while_one_is_injected() -> None:
    report = {"simulated": True, "xid_errors": [79], "throttle_reasons": ["thermal"], "ecc_uncorrectable_volatile": 1, "temp_c": 60}
    assert effective_report(report, fault_injected=True) == report
    assert effective_report(report, fault_injected=False) == {"simulated": True, "temp_c": 60}
    real = {"xid_errors": [79]}
    assert effective_report(real, fault_injected=False) == real  # NVML reports are judged as they are


def test_fatal_takes_a_gpu_out_and_degraded_cordons_only_a_ready_node() -> None:
    assert takes_out([DEGRADED, FATAL]) and not takes_out([DEGRADED]) and not takes_out([])
    assert cordons([DEGRADED], "READY") and cordons([FATAL, DEGRADED], "READY")
    assert not cordons([FATAL], "READY") and not cordons([DEGRADED], "CORDONED") and not cordons([DEGRADED], "LOST")


def test_only_a_job_wider_than_the_node_moves_and_only_after_a_checkpoint_since_the_cordon() -> None:
    assert moves_at_checkpoint(job_gpus=16, node_gpus=8, checkpoint_at=120.0, degraded_since=100.0)
    assert not moves_at_checkpoint(job_gpus=16, node_gpus=8, checkpoint_at=90.0, degraded_since=100.0)
    assert not moves_at_checkpoint(job_gpus=16, node_gpus=8, checkpoint_at=None, degraded_since=100.0)
    assert not moves_at_checkpoint(job_gpus=8, node_gpus=8, checkpoint_at=120.0, degraded_since=100.0)
