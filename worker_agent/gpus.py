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


class SimulatedGpus:
    """Stands in for NVML where there is no GPU: N healthy GPUs of one type."""

    def __init__(self, node_id: str, gpu_type: str, count: int) -> None:
        self.node_id, self.gpu_type, self.count = node_id, gpu_type, count

    def inventory(self) -> list[GpuInfo]:
        return [
            GpuInfo(index=i, uuid=f"GPU-sim-{self.node_id}-{i}", name=self.gpu_type, health={"simulated": True}) for i in range(self.count)
        ]


class NvmlGpus:
    """Reads the real GPUs through nvidia-ml-py."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()

    def inventory(self) -> list[GpuInfo]:
        nvml = self._nvml
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            name = nvml.nvmlDeviceGetName(handle)
            temp = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            out.append(GpuInfo(index=i, uuid=str(uuid), name=str(name), health={"temperature_c": temp}))
        return out
