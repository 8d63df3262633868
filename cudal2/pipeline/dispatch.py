"""Selections -> dispatch table (format 1, docs/contracts.md) and the cubins it names."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from cudal2 import __version__
from cudal2.generator import design_name, launch_recipe
from cudal2.packaging.runtime.table import (
    KERNEL_ONLY_KEYS,
    CublasLtAlgo,
    DispatchTable,
    EagerAlt,
    TableEntry,
)
from cudal2.pipeline.select import Selection
from cudal2.records import sha256_hex


def _cuda_version(runtime: str) -> str:
    return ".".join(runtime.split(".")[:2])


def build_table(
    *,
    name: str,
    version: str,
    package: str,
    manifest_sha256: str,
    selections: Sequence[Selection],
    cubin_of: Callable[[str], bytes],
) -> tuple[DispatchTable, dict[str, bytes]]:
    """The table and {sha256: cubin bytes}. ``cubin_of(artifact_key)`` reads the cache.

    M ranges: per (gpu, dtype, layout, n, k, epilogue) the entries measured at M1 < M2
    < ... serve [1, M1], [M1+1, M2], ...; larger M is not covered (runtime falls back).
    A fused epilogue's targets make entries of their own (``TableEntry.epilogue``).
    """
    groups: dict[tuple, list[Selection]] = defaultdict(list)
    for s in selections:
        t = s.target
        groups[(s.gpu, t.arch, t.dtype, t.layout, t.n, t.k, t.epilogue)].append(s)
    entries: list[TableEntry] = []
    cubins: dict[str, bytes] = {}
    gpus: dict[str, set[str]] = defaultdict(set)  # field -> values, from the winners' GPUs
    for (gpu, arch, dtype, layout, n, k, epilogue), sels in sorted(groups.items()):
        prev = 0
        for s in sorted(sels, key=lambda s: s.target.m):
            own: dict[str, Any] = dict.fromkeys(KERNEL_ONLY_KEYS)  # what the winner fills
            if s.kind == "kernel":
                w = s.winner
                assert w is not None and w.design is not None
                blob = cubin_of(w.artifact_key)
                sha = sha256_hex(blob)
                cubins[sha] = blob
                own.update(
                    kernel=design_name(w.design),
                    symbol=design_name(w.design),
                    cubin_sha256=sha,
                    launch=launch_recipe(w.design),
                    design_key=w.design_key,
                )
                gpus["drivers"].add(w.gpu.driver)
                gpus["cuda_versions"].add(_cuda_version(w.gpu.cuda_runtime))
            elif s.kind == "cublaslt":
                w = s.winner
                assert w is not None and w.vendor
                own.update(
                    kernel=w.vendor["name"],
                    design_key=w.design_key,
                    cublaslt=CublasLtAlgo(
                        version=int(w.vendor["version"]),
                        algo=w.vendor["algo"],
                        workspace_bytes=int(w.vendor["workspace_bytes"]),
                        config=dict(w.vendor.get("config") or {}),
                    ),
                )
            if s.eager is not None:  # a kernel to launch eagerly (pipeline.select)
                alt = s.eager
                assert alt.design is not None and s.kind != "kernel"
                blob = cubin_of(alt.artifact_key)
                sha = sha256_hex(blob)
                cubins[sha] = blob
                own["eager"] = EagerAlt(
                    kernel=design_name(alt.design),
                    symbol=design_name(alt.design),
                    cubin_sha256=sha,
                    launch=launch_recipe(alt.design),
                    design_key=alt.design_key,
                    time_us=_r(alt.median_us),
                )
                gpus["drivers"].add(alt.gpu.driver)
                gpus["cuda_versions"].add(_cuda_version(alt.gpu.cuda_runtime))
            entries.append(
                TableEntry(
                    gpu=gpu,
                    arch=arch,
                    dtype=dtype,
                    layout=layout,
                    n=n,
                    k=k,
                    m_min=prev + 1,
                    m_max=s.target.m,
                    m_measured=s.target.m,
                    kind=s.kind,
                    time_us=_r(s.time_us),
                    baseline="torch",
                    baseline_us=_r(s.baseline_us),
                    speedup=_r(s.speedup, 4),
                    spread=_r(s.spread, 4),
                    measured_at=s.measured_at,
                    candidates=s.candidates,
                    epilogue=epilogue,
                    **own,
                )
            )
            prev = s.target.m
    stamps = sorted(s.measured_at for s in selections)
    table = DispatchTable(
        package=package,
        name=name,
        version=version,
        tool_version=__version__,
        manifest_sha256=manifest_sha256,
        gpu_models=tuple(sorted({s.gpu for s in selections})),
        archs=tuple(sorted({s.target.arch for s in selections})),
        drivers=tuple(sorted(gpus["drivers"])),
        cuda_versions=tuple(sorted(gpus["cuda_versions"])),
        measured_from=stamps[0] if stamps else None,
        measured_to=stamps[-1] if stamps else None,
        entries=tuple(entries),
    )
    return table, cubins


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)
