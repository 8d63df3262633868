"""What a runner over several GPUs must hold to: one GPU model per build.

A measurement is reused and selected per GPU model (``Measurement.reuse_key`` names
it), and two models measure differently even where they share an architecture (the
H100 and the H200 are both sm_90a; the H200's memory is faster). So a runner that
found GPUs of different models refuses them, unless the manifest says those models
are interchangeable (``[runner] interchangeable``): then their answers are recorded
as measured on the model the runner names (the first GPU's), each still tagged with
the GPU that answered it (``GpuInfo.index`` / ``host``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from cudal2.records import GpuInfo


class FleetError(RuntimeError):
    """The GPUs found cannot serve one build; the message names them and what to do."""


def check_fleet(gpus: Sequence[GpuInfo], interchangeable: Sequence[Sequence[str]] = ()) -> GpuInfo:
    """The GPU a build over ``gpus`` measures on (the first), or ``FleetError`` where
    they differ in architecture, or in model without a group of ``interchangeable``
    models holding them all."""
    if not gpus:
        raise FleetError("no GPU found to measure on")
    first = gpus[0]
    archs = sorted({g.arch for g in gpus})
    if len(archs) > 1:
        raise FleetError(
            f"the GPUs found have different architectures ({', '.join(archs)}): "
            f"{_listing(gpus)}; a build measures one architecture (select GPUs with "
            "CUDA_VISIBLE_DEVICES, or [runner] devices)"
        )
    models = sorted({g.name for g in gpus})
    if len(models) > 1 and not any(set(models) <= set(group) for group in interchangeable):
        raise FleetError(
            f"the GPUs found are of different models ({', '.join(models)}): {_listing(gpus)}. "
            "They measure differently, so their answers cannot stand for one model: select "
            "GPUs of one model, or say they are interchangeable in the manifest "
            f"([runner] interchangeable = [{', '.join(repr(m) for m in models)}])"
        )
    return first


def recorded_as(gpu: GpuInfo, first: GpuInfo) -> GpuInfo:
    """The GPU an answer from ``gpu`` is recorded on, in a fleet that ``check_fleet``
    let through with ``first``: its own ``GpuInfo`` (driver, clocks, index, host) with
    the first GPU's model and architecture (for a GPU of the same model: itself)."""
    if (gpu.name, gpu.arch) == (first.name, first.arch):
        return gpu
    return dataclasses.replace(gpu, name=first.name, arch=first.arch)


def check_cublaslt(versions: Mapping[str, int | None]) -> int | None:
    """The one cuBLASLt version the fleet's workers autotune with (``versions``: worker
    -> its version), or ``FleetError``: one build records one version's algorithms (an
    algorithm belongs to the library that offered it)."""
    found = set(versions.values())
    if len(found) > 1:
        raise FleetError(
            "the workers autotune with different cuBLASLt versions ("
            + ", ".join(f"{w}: {v}" for w, v in versions.items())
            + "): one build records one version's algorithms; install one "
            "nvmath-python / cuBLAS for every worker (on every node)"
        )
    return found.pop() if found else None


def _listing(gpus: Sequence[GpuInfo]) -> str:
    return ", ".join(g.where for g in gpus)
