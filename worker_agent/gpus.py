"""GPU inventory backends: NVML on real hardware, a simulated one elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class GpuInfo:
    index: int
    uuid: str
    name: str
    health: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "name": self.name, "health": self.health}


class GpuBackend(Protocol):
    def inventory(self) -> list[GpuInfo]: ...

    def health(self, busy: frozenset[int]) -> dict[int, dict[str, Any]]:
        """Per GPU index, its health report (keys in ``fairgang.health.REPORT_KEYS``); ``busy``: indices running members."""
        ...

    def inject(self, faults: dict[int, list[dict[str, Any]]]) -> None:
        """The faults the control plane wants simulated, per GPU index (replacing the previous set); real backends ignore it."""
        ...


class SimulatedGpus:
    """Stands in for NVML where there is no GPU: N GPUs of one type, healthy unless faults are injected."""

    def __init__(self, node_id: str, gpu_type: str, count: int) -> None:
        self.node_id, self.gpu_type, self.count = node_id, gpu_type, count
        self.faults: dict[int, list[dict[str, Any]]] = {}

    def inventory(self) -> list[GpuInfo]:
        busy: frozenset[int] = frozenset()
        health = self.health(busy)
        return [GpuInfo(index=i, uuid=f"GPU-sim-{self.node_id}-{i}", name=self.gpu_type, health=health[i]) for i in range(self.count)]

    def inject(self, faults: dict[int, list[dict[str, Any]]]) -> None:
        self.faults = {int(i): list(f) for i, f in faults.items()}

    def health(self, busy: frozenset[int]) -> dict[int, dict[str, Any]]:
        out = {}
        for i in range(self.count):
            report: dict[str, Any] = {
                "simulated": True,
                "utilization_pct": 97.0 if i in busy else 0.0,
                "memory_used_mb": 60_000 if i in busy else 0,
                "memory_total_mb": 81_559,
                "temperature_c": 68 if i in busy else 35,
                "xid_errors": [],
                "ecc_uncorrectable_volatile": 0,
                "ecc_uncorrectable_aggregate": 0,
                "ecc_correctable_volatile": 0,
                "retired_pages": 0,
                "throttle_reasons": [],
            }
            for fault in self.faults.get(i, []):
                kind = fault.get("kind")
                count = int(fault.get("count") or 1)
                if kind == "xid":
                    report["xid_errors"].append(int(fault.get("xid") or 79))
                elif kind == "ecc_uncorrectable":
                    report["ecc_uncorrectable_volatile"] += count
                    report["ecc_uncorrectable_aggregate"] += count
                elif kind == "ecc_correctable":
                    report["ecc_correctable_volatile"] += count
                elif kind == "retired_pages":
                    report["retired_pages"] += count
                elif kind in ("thermal", "power"):
                    report["throttle_reasons"].append(kind)
                    if kind == "thermal":
                        report["temperature_c"] = 92
            out[i] = report
        return out


#: NVML clock-throttle reason bits we report (nvmlClocksThrottleReason*), by name.
_THROTTLE_BITS = {
    "power": ("nvmlClocksThrottleReasonSwPowerCap", "nvmlClocksThrottleReasonHwPowerBrakeSlowdown"),
    "thermal": ("nvmlClocksThrottleReasonSwThermalSlowdown", "nvmlClocksThrottleReasonHwThermalSlowdown"),
    "hw_slowdown": ("nvmlClocksThrottleReasonHwSlowdown",),
}


class NvmlGpus:
    """Reads the real GPUs through nvidia-ml-py. Every query is guarded: a GPU or driver may not support it."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._events: Any = None
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for handle in self._handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
                except pynvml.NVMLError:
                    pass
        except pynvml.NVMLError:
            self._events = None

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def inject(self, faults: dict[int, list[dict[str, Any]]]) -> None:
        del faults  # real GPUs fail by themselves

    def inventory(self) -> list[GpuInfo]:
        nvml = self._nvml
        health = self.health(frozenset())
        out = []
        for i, handle in enumerate(self._handles):
            uuid = self._try(nvml.nvmlDeviceGetUUID, handle)
            name = self._try(nvml.nvmlDeviceGetName, handle)
            out.append(GpuInfo(index=i, uuid=str(uuid), name=str(name), health=health[i]))
        return out

    def _xids(self) -> dict[int, list[int]]:
        """Critical Xid errors since the last call, per GPU index (drains the event set without waiting)."""
        nvml = self._nvml
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        uuids = {self._try(nvml.nvmlDeviceGetUUID, h): i for i, h in enumerate(self._handles)}
        for _ in range(1000):
            try:
                data = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:
                break  # timeout: no more events
            index = uuids.get(self._try(nvml.nvmlDeviceGetUUID, data.device))
            if index is not None:
                found.setdefault(index, []).append(int(data.eventData))
        return found

    def health(self, busy: frozenset[int]) -> dict[int, dict[str, Any]]:
        del busy  # measured, not inferred
        nvml = self._nvml
        xids = self._xids()
        out = {}
        for i, handle in enumerate(self._handles):
            report: dict[str, Any] = {"xid_errors": xids.get(i, [])}
            util = self._try(nvml.nvmlDeviceGetUtilizationRates, handle)
            if util is not None:
                report["utilization_pct"] = float(util.gpu)
            mem = self._try(nvml.nvmlDeviceGetMemoryInfo, handle)
            if mem is not None:
                report["memory_used_mb"], report["memory_total_mb"] = int(mem.used) // 2**20, int(mem.total) // 2**20
            temp = self._try(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
            if temp is not None:
                report["temperature_c"] = int(temp)
            for key, error, counter in (
                ("ecc_uncorrectable_volatile", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC),
                ("ecc_uncorrectable_aggregate", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC),
                ("ecc_correctable_volatile", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC),
            ):
                value = self._try(nvml.nvmlDeviceGetTotalEccErrors, handle, error, counter)
                if value is not None:
                    report[key] = int(value)
            retired = 0
            causes = (nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
            for cause in causes:
                pages = self._try(nvml.nvmlDeviceGetRetiredPages, handle, cause)
                retired += len(pages or [])
            report["retired_pages"] = retired
            remap = self._try(nvml.nvmlDeviceGetRemappedRows, handle)
            if remap is not None:  # (correctable rows, uncorrectable rows, pending, failure)
                report["remapped_rows_uncorrectable"], report["remapped_rows_failed"] = int(remap[1]), int(bool(remap[3]))
            reasons = self._try(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
            if reasons is not None:
                report["throttle_reasons"] = sorted(
                    name for name, bits in _THROTTLE_BITS.items() if any(int(reasons) & int(getattr(nvml, b, 0)) for b in bits)
                )
            out[i] = report
        return out
