"""nvcc -> cubin, into a content-addressed artifact cache, in parallel on every core.

The cache (``generator/cache.py``) is ``<cache>/<key[:2]>/<key>/{kernel.cu,
kernel.cubin, build.json}`` with key = sha256(source, nvcc version, flags, arch) and the
cubin's sha256 and size in ``build.json``; every read checks them, and a broken entry is
quarantined and compiled again. A compile error is recorded (``ok: false`` and the
compiler's text), never raised. nvcc runs as ``generator/nvcc.py`` says: the source at a
fixed path (so equal sources give byte-identical cubins on every machine), in a process
group that dies with the build, its temporary files inside the cache, at a lower CPU
priority than the build (``NVCC_NICENESS``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import TypeVar

from cudal2.generator import nvcc
from cudal2.generator.cache import ArtifactCache, CacheIntegrityError, default_cache_dir
from cudal2.generator.render import render, symbol
from cudal2.records import BuildResult, KernelDesign, canonical_json, sha256_hex

__all__ = [
    "BASE_FLAGS",
    "ArtifactCache",
    "CacheIntegrityError",
    "CompileInterruptedError",
    "CubinUnavailableError",
    "NvccNotFoundError",
    "artifact_key",
    "artifact_key_of",
    "build",
    "build_all",
    "checked_cubin",
    "checked_cubin_path",
    "default_cache_dir",
    "nvcc_version",
]

_T = TypeVar("_T")

BASE_FLAGS = ("-cubin", "-O3", "-std=c++17", "-Xptxas=-v", "-lineinfo")
COMPILE_TIMEOUT_S = 300
# How much nvcc's niceness is raised above the build's (``nvcc.run_guarded``): compiles
# fill every core while the measuring worker and the pipeline's threads feed the GPU on
# the same CPUs; niced, nvcc takes only what they leave (a lone compile runs as fast).
NVCC_NICENESS = 10


class NvccNotFoundError(RuntimeError):
    """nvcc is needed to build kernels and is not on PATH."""


class CompileInterruptedError(RuntimeError):
    """nvcc was killed before it finished (the build is stopping): nothing is recorded."""


class CubinUnavailableError(RuntimeError):
    """A design's cubin cannot be had: its compile failed, or it compiles to another
    artifact than the one asked for."""


def arch_flags(arch: str) -> tuple[str, ...]:
    # The -gencode form: "-arch=sm_90a" also runs a plain sm_90 pass on some nvcc
    # versions, which rejects the sm_90a-only instructions later families use.
    num = arch.removeprefix("sm_")
    return (f"-gencode=arch=compute_{num},code=sm_{num}",)


def _nvcc() -> str:
    """nvcc, by its real path. nvcc finds its headers relative to its own folder and
    ``-lineinfo`` writes their paths into the cubin: run through a symlinked folder
    (``/usr/local/cuda/bin/nvcc``, as on the lent GPU machine) it makes other bytes from
    the same source than run from the real folder (``/usr/local/cuda-13.0``, as here).
    That was one reason a database measured there packaged here into other cubin bytes;
    not the only one (docs/contracts.md, "Artifact cache")."""
    path = shutil.which("nvcc")
    if path is None:
        raise NvccNotFoundError(
            "nvcc not found on PATH: install the CUDA toolkit (13.0 is used here)"
        )
    return os.path.realpath(path)


@cache
def nvcc_version() -> str:
    """nvcc's own version line, e.g. 'Cuda compilation tools, release 13.0, V13.0.88'."""
    out = subprocess.run([_nvcc(), "--version"], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in out.splitlines() if "release" in ln]
    return lines[-1].strip() if lines else out.strip().splitlines()[-1]


def artifact_key(source: str, arch: str, flags: tuple[str, ...]) -> str:
    return sha256_hex(
        canonical_json(
            {"source": source, "nvcc": nvcc_version(), "flags": list(flags), "arch": arch}
        )
    )


_REG_RE = re.compile(r"Used (\d+) registers")
_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM_RE = re.compile(r"(\d+) bytes smem")


def _parse_resources(log: str) -> tuple[int | None, int | None, int | None]:
    regs = _REG_RE.search(log)
    spill = _SPILL_RE.search(log)
    smem = _SMEM_RE.search(log)
    return (
        int(regs.group(1)) if regs else None,
        int(spill.group(1)) + int(spill.group(2)) if spill else None,
        int(smem.group(1)) if smem else 0,
    )


def artifact_key_of(design: KernelDesign) -> str:
    """The artifact key this design compiles to here (renders; runs no compiler)."""
    return artifact_key(render(design), design.arch, BASE_FLAGS + arch_flags(design.arch))


def build(
    design: KernelDesign,
    cache: ArtifactCache,
    stop: nvcc.Stop | None = None,
    niceness: int = NVCC_NICENESS,
) -> BuildResult:
    """Compile one design (or return its cached result, checked), nvcc's niceness
    raised by ``niceness``. Never raises on a compile error; raises
    ``CompileInterruptedError`` when nvcc was killed (``stop``)."""
    source = render(design)
    flags = BASE_FLAGS + arch_flags(design.arch)
    key = artifact_key(source, design.arch, flags)
    hit = cache.get(key)
    if hit is not None:
        return hit
    with cache.scratch() as work:
        run, cubin = nvcc.compile_cubin(
            _nvcc(), flags, source, key, work, COMPILE_TIMEOUT_S, stop, niceness
        )
        if run.killed:  # not the source's fault: recording a failure would be a lie
            raise CompileInterruptedError(f"nvcc was killed compiling {symbol(design)}")
        if run.returncode is None:
            log = f"nvcc timed out after {COMPILE_TIMEOUT_S} s\n{run.stdout}{run.stderr}"
        else:
            log = run.stdout + run.stderr
        ok = cubin is not None
        regs, spills, smem = _parse_resources(log) if ok else (None, None, None)
        result = BuildResult(
            design_key=design.key,
            artifact_key=key,
            ok=ok,
            symbol=symbol(design),
            error="" if ok else log[-8000:],
            registers=regs,
            spill_bytes=spills,
            smem_static=smem,
            nvcc_version=nvcc_version(),
            flags=flags,
            cubin_sha256=sha256_hex(cubin) if cubin is not None else "",
            cubin_size=len(cubin) if cubin is not None else None,
        )
        cache.put(result, source, cubin, staging=work)
    return result


def build_all(
    designs: Iterable[KernelDesign],
    cache: ArtifactCache,
    jobs: int | None = None,
    on_done: Callable[[BuildResult], None] | None = None,
    niceness: int = NVCC_NICENESS,
) -> dict[str, BuildResult]:
    """Compile designs in parallel (nvcc runs as subprocesses, so threads suffice),
    each nvcc's niceness raised by ``niceness`` (``NVCC_NICENESS``: below the build's
    measuring; 0: as the build's own).

    Returns design key -> BuildResult. Cached designs cost one render and a checked
    file read. On any exception (Ctrl-C included) the compiles not started are dropped
    and the running ones killed before it propagates.
    """
    unique = {d.key: d for d in designs}
    jobs = jobs or os.cpu_count() or 1
    results: dict[str, BuildResult] = {}
    if unique:
        nvcc.sweep_sources()
    stop = nvcc.Stop()
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for res in pool.map(lambda d: build(d, cache, stop, niceness), unique.values()):
            results[res.design_key] = res
            if on_done:
                on_done(res)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        stop.stop()
        raise
    finally:
        pool.shutdown(wait=True)
    return results


def checked_cubin(design: KernelDesign, cache: ArtifactCache, artifact: str | None = None) -> bytes:
    """The cubin of ``design``, its bytes checked against the sha256 its compile
    recorded: compiled (again) where the cache has no sound entry. ``artifact``: the
    artifact key it must have (a measured one). Raises ``CubinUnavailableError``."""
    return _checked(design, cache, artifact, cache.cubin)


def sass_listing(design: KernelDesign, cache: ArtifactCache) -> tuple[str, BuildResult]:
    """The SASS listing of ``design`` (``sass.sass`` of its checked cubin) and its build
    result; raises ``RuntimeError`` with nvcc's text where it does not compile. For
    experiments that count instructions without a GPU."""
    from cudal2.generator import sass

    b = build(design, cache)
    if not b.ok:
        raise RuntimeError(f"{b.symbol} does not compile:\n{b.error}")
    return sass.sass(checked_cubin(design, cache), b.symbol), b


def checked_cubin_path(
    design: KernelDesign, cache: ArtifactCache, artifact: str | None = None
) -> Path:
    """Where the checked cubin of ``design`` lies (for a measuring job to open), as
    ``checked_cubin``."""
    return _checked(design, cache, artifact, cache.cubin_path)


def _checked(
    design: KernelDesign, cache: ArtifactCache, artifact: str | None, read: Callable[[str], _T]
) -> _T:
    problem = ""
    for attempt in (1, 2):  # again only where the entry was quarantined by the read
        b = build(design, cache)
        if artifact is not None and b.artifact_key != artifact:
            raise CubinUnavailableError(
                f"{b.symbol} compiles to artifact {b.artifact_key} here, not the measured "
                f"{artifact} (template or nvcc changed)"
            )
        if not b.ok and attempt == 2:
            first = next((ln for ln in b.error.splitlines() if "error" in ln), b.error[:200])
            raise CubinUnavailableError(f"{b.symbol} does not compile: {first.strip()}")
        try:  # a failed compile's entry asked for its cubin is quarantined: compile again
            return read(b.artifact_key)
        except CacheIntegrityError as exc:
            problem = exc.problem
    raise CubinUnavailableError(f"{symbol(design)}: the cache entry broke twice: {problem}")
