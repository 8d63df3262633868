"""What GPU we are on, read as found (clocks are never changed).

nvidia-smi lists every GPU of the host; CUDA sees those ``CUDA_VISIBLE_DEVICES``
names, in its order, renumbered from 0. ``gpu_names`` and ``current_gpu`` read
nvidia-smi through that filter, so device ordinal ``i`` here is CUDA's device ``i``
(what a worker passes to ``torch.cuda.set_device``), and ``visible_device(i)`` is the
entry a child process given only that GPU sets ``CUDA_VISIBLE_DEVICES`` to.
"""

from __future__ import annotations

import os
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


def _visible(rows: list[str]) -> list[str]:
    """``rows`` (nvidia-smi lines of ``index, uuid, ...``, one per GPU of the host)
    filtered and ordered as CUDA sees them under ``CUDA_VISIBLE_DEVICES``: each entry
    an index or a (prefix of a) UUID; CUDA stops at the first entry that names no
    GPU, and an empty value hides every GPU. MIG instances cannot be mapped to
    nvidia-smi's GPU rows: then every row is kept, as before this filter."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return rows
    entries = [e.strip() for e in spec.split(",")]
    if any(e.startswith("MIG-") for e in entries):
        return rows
    parsed = [[p.strip() for p in r.split(",")] for r in rows]
    out: list[str] = []
    for entry in entries:
        match = [
            r
            for r in parsed
            if (entry.isdigit() and r[0] == str(int(entry)))
            or (entry.startswith("GPU-") and r[1].startswith(entry))
        ]
        if len(match) != 1 or ", ".join(match[0]) in out:
            break  # as CUDA: an entry that names no GPU (or one already named) ends the list
        out.append(", ".join(match[0]))
    return out


def _visible_smi(query: str) -> list[list[str]]:
    """nvidia-smi's ``query`` fields per GPU visible to CUDA, in CUDA's device order."""
    rows = _visible(_smi(f"index,uuid,{query}"))
    return [[p.strip() for p in r.split(",")][2:] for r in rows]


def gpu_names() -> list[str]:
    """Names of the GPUs CUDA sees (``CUDA_VISIBLE_DEVICES`` honoured), in its device
    order, without initialising CUDA in this process (nvidia-smi)."""
    return [", ".join(r) for r in _visible_smi("name")]


def visible_device(ordinal: int) -> str:
    """What ``CUDA_VISIBLE_DEVICES`` of a child process is set to so that it sees only
    CUDA device ``ordinal`` of this process (as its device 0): the parent's entry where
    it has the variable, else the ordinal itself."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return str(ordinal)
    entries = [e.strip() for e in spec.split(",")]
    if not 0 <= ordinal < len(entries):
        raise ValueError(f"CUDA device {ordinal} is not visible (CUDA_VISIBLE_DEVICES={spec!r})")
    return entries[ordinal]


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
    row = _visible_smi("driver_version,clocks.sm,clocks.mem")
    driver, clocks = "unknown", {}
    if row and len(row) > device:
        parts = row[device]
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
