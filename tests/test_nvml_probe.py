"""scripts/nvml_probe.py: one clear line and a non-zero exit where there is no NVML; tables from the agent's NVML backend where there is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "nvml_probe.py"

#: A stand-in for nvidia-ml-py with two GPUs, the second one hot, throttled and with ECC errors.
FAKE_PYNVML = """
from types import SimpleNamespace

class NVMLError(Exception):
    pass

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 0, 1
nvmlEventTypeXidCriticalError = 8
nvmlClocksThrottleReasonSwPowerCap = 4
nvmlClocksThrottleReasonHwSlowdown = 8
nvmlClocksThrottleReasonSwThermalSlowdown = 32
nvmlClocksThrottleReasonHwThermalSlowdown = 64
nvmlClocksThrottleReasonHwPowerBrakeSlowdown = 128

def nvmlInit(): pass
def nvmlDeviceGetCount(): return 2
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlEventSetCreate(): return object()
def nvmlDeviceRegisterEvents(handle, kinds, events): pass
def nvmlEventSetWait_v2(events, timeout): raise NVMLError("timeout")
def nvmlDeviceGetUUID(h): return f"GPU-fake-{h}"
def nvmlDeviceGetName(h): return "NVIDIA H200"
def nvmlDeviceGetUtilizationRates(h): return SimpleNamespace(gpu=[12, 99][h], memory=0)
def nvmlDeviceGetMemoryInfo(h): return SimpleNamespace(used=[1, 100_000][h] * 2**20, total=143_771 * 2**20)
def nvmlDeviceGetTemperature(h, sensor): return [31, 91][h]
def nvmlDeviceGetTotalEccErrors(h, error, counter): return [0, 7 if error else 250][h]
def nvmlDeviceGetRetiredPages(h, cause): return [] if h == 0 else [1, 2]
def nvmlDeviceGetRemappedRows(h): raise NVMLError("not supported")
def nvmlDeviceGetCurrentClocksThrottleReasons(h): return [0, 32 | 4][h]
def nvmlSystemGetDriverVersion(): return "570.00"
def nvmlSystemGetCudaDriverVersion(): return 12080
"""


def run(*args: str, fake: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if fake is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(fake), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_without_nvml_it_fails_with_one_clear_line() -> None:
    out = run()  # this machine has no NVIDIA driver
    assert out.returncode == 1
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("nvml_probe: no NVML here") and "no NVIDIA driver or GPU" in lines[0]


def test_with_nvml_it_prints_inventory_temperatures_throttling_and_ecc(tmp_path: Path) -> None:
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    out = run(fake=tmp_path)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "driver=570.00" in text and "cuda=12.8" in text and "gpus=2" in text
    for heading in ("Inventory", "Temperature, utilisation, clock-throttle reasons", "ECC, retired pages"):
        assert heading in text
    rows = [line.split() for line in text.splitlines()]
    assert ["1", "91", "99.0", "power,thermal"] in rows
    assert ["1", "7", "7", "250", "4", "-", "-", "none"] in rows  # 2 pages for each of the 2 causes
    assert any(r[:3] == ["0", "NVIDIA", "H200"] and "GPU-fake-0" in r for r in rows)

    raw = run("--json", "--samples", "2", "--interval", "0", fake=tmp_path)
    samples = [json.loads(line) for line in raw.stdout.splitlines()]
    assert [s["sample"] for s in samples] == [0, 1]
    assert samples[0]["gpus"][1]["health"]["throttle_reasons"] == ["power", "thermal"]
