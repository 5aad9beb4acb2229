"""Every policy knob of the pure core is a setting of the placement service (FAIRGANG_<NAME>), and reaches the core."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, cast

from fairgang.settings import Settings
from scheduler.core import SchedulerConfig
from scheduler.service import PlacementService

#: Not a policy: a bound on one cycle's cost, fixed in the core.
NOT_SETTINGS = {"max_preemption_plans"}


def _other_value(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    return value / 2 + 0.1


def test_each_scheduler_config_field_is_a_setting_the_service_passes_to_the_core() -> None:
    names = [f.name for f in fields(SchedulerConfig) if f.name not in NOT_SETTINGS]
    missing = [name for name in names if name not in Settings.model_fields]
    assert not missing, f"SchedulerConfig fields without a setting: {missing}"
    changed = {name: _other_value(getattr(SchedulerConfig(), name)) for name in names}
    settings = Settings(**changed)
    service = PlacementService(settings, cast(Any, None), cast(Any, None), holder="test")
    assert service.config == SchedulerConfig(**changed)
    assert all(getattr(service.config, name) != getattr(SchedulerConfig(), name) for name in names)
