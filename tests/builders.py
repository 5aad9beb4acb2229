"""Small builders for specs and bindings used across tests."""

from __future__ import annotations

from typing import Any

from fairgang.spec import JobSpec


def spec_dict(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "train-1",
        "entrypoint": ["python3", "-c", "print('hi')"],
        "gpu_type": "H100-80GB",
        "gpu_count": 1,
        "max_runtime": "1h",
        "checkpoint_dir": "/ckpt/alpha/train-1",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def job_spec(**overrides: Any) -> JobSpec:
    return JobSpec.model_validate(spec_dict(**overrides))


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals (start, end) open at one instant."""
    points = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = now = 0
    for _, delta in points:
        now += delta
        most = max(most, now)
    return most
