"""nvcc -> cubin, into a content-addressed artifact cache, in parallel on every core.

Cache layout: ``<cache>/<key[:2]>/<key>/{kernel.cu, kernel.cubin, build.json}`` with
key = sha256(source, nvcc version, flags, arch). An entry is written in a temporary
folder beside it and renamed into place, so readers see a whole entry or none. A
compile error is recorded (``ok: false`` and the compiler's text), never raised.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

from cudal2.generator.render import render, symbol
from cudal2.records import BuildResult, KernelDesign, canonical_json, sha256_hex

BASE_FLAGS = ("-cubin", "-O3", "-std=c++17", "-Xptxas=-v", "-lineinfo")
COMPILE_TIMEOUT_S = 300


class NvccNotFoundError(RuntimeError):
    """nvcc is needed to build kernels and is not on PATH."""


def arch_flags(arch: str) -> tuple[str, ...]:
    # The -gencode form: "-arch=sm_90a" also runs a plain sm_90 pass on some nvcc
    # versions, which rejects the sm_90a-only instructions later families use.
    num = arch.removeprefix("sm_")
    return (f"-gencode=arch=compute_{num},code=sm_{num}",)


@cache
def nvcc_version() -> str:
    """nvcc's own version line, e.g. 'Cuda compilation tools, release 13.0, V13.0.88'."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise NvccNotFoundError(
            "nvcc not found on PATH: install the CUDA toolkit (13.0 is used here)"
        )
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in out.splitlines() if "release" in ln]
    return lines[-1].strip() if lines else out.strip().splitlines()[-1]


def artifact_key(source: str, arch: str, flags: tuple[str, ...]) -> str:
    return sha256_hex(
        canonical_json(
            {"source": source, "nvcc": nvcc_version(), "flags": list(flags), "arch": arch}
        )
    )


def default_cache_dir() -> Path:
    return Path(os.environ.get("CUDAL2_CACHE", Path.home() / ".cache" / "cudal2" / "artifacts"))


class ArtifactCache:
    """The content-addressed store of compiled kernels."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root else default_cache_dir()

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> BuildResult | None:
        path = self.entry(key) / "build.json"
        if not path.exists():
            return None
        return BuildResult.from_json(json.loads(path.read_text()))

    def cubin(self, key: str) -> bytes:
        return (self.entry(key) / "kernel.cubin").read_bytes()

    def put(self, result: BuildResult, source: str, cubin: bytes | None) -> None:
        final = self.entry(result.artifact_key)
        if final.exists():
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{result.artifact_key[:8]}-", dir=final.parent))
        try:
            (tmp / "kernel.cu").write_text(source)
            if cubin is not None:
                (tmp / "kernel.cubin").write_bytes(cubin)
            (tmp / "build.json").write_text(json.dumps(result.as_json(), indent=2, sort_keys=True))
            try:
                os.rename(tmp, final)
            except OSError:
                if not final.exists():  # lost a race with a writer of the same key: fine
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


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


def build(design: KernelDesign, cache: ArtifactCache) -> BuildResult:
    """Compile one design (or return its cached result). Never raises on a compile error."""
    source = render(design)
    flags = BASE_FLAGS + arch_flags(design.arch)
    key = artifact_key(source, design.arch, flags)
    hit = cache.get(key)
    if hit is not None:
        return hit
    with tempfile.TemporaryDirectory(prefix="cudal2-nvcc-") as tmp:
        cu, cubin = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        cu.write_text(source)
        cmd = ["nvcc", *flags, "-o", str(cubin), str(cu)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
            log, ok = proc.stdout + proc.stderr, proc.returncode == 0 and cubin.exists()
        except subprocess.TimeoutExpired:
            log, ok = f"nvcc timed out after {COMPILE_TIMEOUT_S} s", False
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
        )
        cache.put(result, source, cubin.read_bytes() if ok else None)
    return result


def build_all(
    designs: Iterable[KernelDesign],
    cache: ArtifactCache,
    jobs: int | None = None,
    on_done: Callable[[BuildResult], None] | None = None,
) -> dict[str, BuildResult]:
    """Compile designs in parallel (nvcc runs as subprocesses, so threads suffice).

    Returns design key -> BuildResult. Cached designs cost one render and a file read.
    """
    unique = {d.key: d for d in designs}
    jobs = jobs or os.cpu_count() or 1
    results: dict[str, BuildResult] = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for res in pool.map(lambda d: build(d, cache), unique.values()):
            results[res.design_key] = res
            if on_done:
                on_done(res)
    return results
