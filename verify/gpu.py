"""What GPU we are on, read as found (clocks are never changed)."""

from __future__ import annotations

import shutil
import socket
import subprocess

from cudal2.records import GpuInfo


def _smi(query: str) -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


def gpu_names() -> list[str]:
    """Names of the visible GPUs without initialising CUDA in this process (nvidia-smi)."""
    return _smi("name")


def gpu_models() -> list[tuple[str, str]]:
    """(name, arch) of each visible GPU, in nvidia-smi's order, without initialising
    CUDA in this process: what a build proposes for while its workers start."""
    models = []
    for row in _smi("name,compute_cap,mig.mode.current"):
        fields = [f.strip() for f in row.rsplit(",", 2)]
        if len(fields) != 3:
            return []
        name, cap, mig = fields
        major, _, minor = cap.partition(".")
        if not (major.isdigit() and minor.isdigit()) or mig == "Enabled":
            # a driver that cannot say, or MIG instances (CUDA names them otherwise):
            # the caller waits for a worker's answer
            return []
        models.append((name, arch_of(int(major), int(minor))))
    return models


def arch_of(major: int, minor: int) -> str:
    # sm_90 parts run sm_90a cubins; the 'a' target is what our Hopper kernels need.
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def current_gpu(device: int = 0) -> GpuInfo:
    """Read inside a worker that has CUDA initialised."""
    import torch

    props = torch.cuda.get_device_properties(device)
    row = _smi("driver_version,clocks.sm,clocks.mem")
    driver, clocks = "unknown", {}
    if row and len(row) > device:
        parts = [p.strip() for p in row[device].split(",")]
        driver = parts[0]
        try:
            clocks = {"sm": int(parts[1]), "mem": int(parts[2])}
        except (IndexError, ValueError):
            clocks = {}
    return GpuInfo(
        name=props.name,
        arch=arch_of(props.major, props.minor),
        sm_count=props.multi_processor_count,
        driver=driver,
        cuda_runtime=str(torch.version.cuda),
        torch=torch.__version__,
        clocks_mhz=clocks,
        index=device,
        host=socket.gethostname(),
    )
