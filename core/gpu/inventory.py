"""Which CUDA devices are here, asked in a child process so a broken driver cannot hang the caller.

`python -m core.gpu.inventory` prints one JSON object; detect_devices() runs it with a timeout.
Without pycuda (the optional `gpu` extra) or without a driver, the answer is "no CUDA device" and why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    shared_per_block: int
    shared_per_block_optin: int
    registers_per_block: int
    clock_khz: int
    memory_bytes: int

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


def _probe() -> dict[str, Any]:
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        return {"devices": [], "reason": f"pycuda is not installed ({exc}): no CUDA device, compile checks only"}
    try:
        cuda.init()
        attr = cuda.device_attribute
        devices = []
        for i in range(cuda.Device.count()):
            d = cuda.Device(i)
            a = d.get_attributes()
            devices.append(asdict(DeviceInfo(
                index=i, name=d.name(), compute_capability=d.compute_capability(),
                sm_count=a[attr.MULTIPROCESSOR_COUNT], shared_per_block=a[attr.MAX_SHARED_MEMORY_PER_BLOCK],
                shared_per_block_optin=a.get(attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 0),
                registers_per_block=a[attr.MAX_REGISTERS_PER_BLOCK], clock_khz=a[attr.CLOCK_RATE],
                memory_bytes=d.total_memory())))
    except Exception as exc:
        return {"devices": [], "reason": f"CUDA driver unavailable ({exc}): no CUDA device, compile checks only"}
    if not devices:
        return {"devices": [], "reason": "no CUDA device found: compile checks only"}
    return {"devices": devices, "reason": ""}


def detect_devices(timeout_s: float = 30.0) -> tuple[list[DeviceInfo], str]:
    try:
        proc = subprocess.run([sys.executable, "-m", "core.gpu.inventory"], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
        data = json.loads(proc.stdout or "{}")
    except subprocess.TimeoutExpired:
        return [], f"device query timed out after {timeout_s:g} s: compile checks only"
    except ValueError:
        return [], "device query failed: compile checks only"
    devices = [DeviceInfo(**{**d, "compute_capability": tuple(d["compute_capability"])})
               for d in data.get("devices", [])]
    return devices, data.get("reason", "") if not devices else ""


if __name__ == "__main__":
    print(json.dumps(_probe()))
