"""The GPU health policy (fairgang.health), pure."""

from __future__ import annotations

from fairgang.health import Thresholds, assess, parse_xids
from worker_agent.gpus import SimulatedGpus

LIMITS = Thresholds(throttle_beats=3, correctable_ecc_rise=10)


def test_fatal_xids_and_uncorrectable_ecc_take_the_gpu_out_but_other_xids_do_not() -> None:
    assert parse_xids("48,92-95") == {48, 92, 93, 94, 95}
    assert [f.kind for f in assess({"xid_errors": [79]}, {}, LIMITS)[0]] == ["xid"]
    assert assess({"xid_errors": [13]}, {}, LIMITS)[0] == []
    assert [(f.severity, f.kind) for f in assess({"ecc_uncorrectable_volatile": 1}, {}, LIMITS)[0]] == [("fatal", "ecc_uncorrectable")]


def test_only_sustained_throttling_or_rising_correctable_ecc_degrades() -> None:
    stored: dict = {}
    severities = []
    for _ in range(3):
        findings, book = assess({"throttle_reasons": ["thermal"]}, stored, LIMITS)
        stored = book
        severities.append([f.severity for f in findings])
    assert severities == [[], [], ["degraded"]]
    assert assess({"throttle_reasons": []}, stored, LIMITS)[1]["throttled_beats"] == 0
    assert assess({"ecc_correctable_volatile": 15}, {"ecc_correctable_volatile": 2}, LIMITS)[0][0].kind == "ecc_correctable"


def test_the_simulated_backend_reports_each_injected_fault() -> None:
    gpus = SimulatedGpus("n1", "H100-80GB", 2)
    gpus.inject({1: [{"kind": "xid", "xid": 48}, {"kind": "ecc_uncorrectable"}, {"kind": "power"}, {"kind": "retired_pages", "count": 70}]})
    report = gpus.health(frozenset({0}))
    assert report[0]["utilization_pct"] > 0 and report[0]["xid_errors"] == []
    assert report[1]["xid_errors"] == [48] and report[1]["ecc_uncorrectable_volatile"] == 1 and report[1]["throttle_reasons"] == ["power"]
    assert {f.kind for f in assess(report[1], {}, LIMITS)[0]} == {"xid", "ecc_uncorrectable", "retired_pages"}
