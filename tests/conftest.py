"""Shared fixtures, all from real data recorded on the H100.

``recorded_measurements`` is the committed database of the default manifest
(manifests/default.measurements.jsonl). ``recorded_table`` / ``recorded_cubins`` are
a dispatch table built from it by the real table builder, with every target's
fastest *correct* recorded kernel (cuBLASLt records left out) as a kernel entry
whether or not it beat cuBLAS, so the runtime's kernel path, the wheel and the diff are
exercised with real cubins. Tables are typed and frozen (``DispatchTable``): tests vary
them through ``dataclasses.replace`` or their ``as_json()``; they never hard-code entry
values.

No kernel ships without a clean compute-sanitizer check on record: the committed
databases hold the H100's checks of every kernel their CPU-built tables ship
(``ci/gpu_memcheck.sh``); ``db_unchecked(stem)`` is a copy without them, as the file
was before that run.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB, default_database
from cudal2.generator import design_name
from cudal2.generator.compile import ArtifactCache, build_all
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.packaging import native_build
from cudal2.packaging.runtime.table import DispatchTable
from cudal2.packaging.wheel import package_name, write_wheel
from cudal2.pipeline import build as pipeline_build
from cudal2.pipeline.dispatch import build_table
from cudal2.pipeline.select import Selection
from cudal2.records import Measurement, SanitizerCheck


def committed_db(stem: str) -> Path:
    """``manifests/<stem>.measurements.jsonl`` (or its ``.gz``): H100 measurements, and the
    H100's compute-sanitizer checks of every kernel its CPU-built table ships
    (``ci/gpu_memcheck.sh``, bench/results/h100-memcheck-2026-11-24.txt)."""
    return default_database(default_manifest_path().with_name(f"{stem}.toml"))


def read_text(path: Path) -> str:
    """A database file's text, gzipped or plain."""
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode()


@pytest.fixture(scope="session")
def db_unchecked(tmp_path_factory) -> Callable[[str], Path]:
    """``db_unchecked(stem)``: a copy of the committed database without its sanitizer
    check lines, the file as it was before the H100 memcheck run recorded them (a line
    of either kind is one JSON object; only ``record: sanitizer_check`` lines go)."""
    root = tmp_path_factory.mktemp("unchecked")

    def make(stem: str) -> Path:
        copy = root / f"{stem}.measurements.jsonl"
        if not copy.exists():
            lines = read_text(committed_db(stem)).splitlines(keepends=True)
            kept = [x for x in lines if json.loads(x).get("record") != "sanitizer_check"]
            assert len(kept) < len(lines), f"{stem}: the committed database holds no checks"
            copy.write_text("".join(kept))
        return copy

    return make


@pytest.fixture(scope="session")
def db_recorded_checks() -> tuple[SanitizerCheck, ...]:
    """The default database's sanitizer checks (the H100's)."""
    checks = MeasurementDB(committed_db("default")).load().checks
    assert checks, "the committed default database holds no sanitizer checks"
    return checks


@pytest.fixture(scope="session")
def recorded_measurements() -> list[Measurement]:
    ms = MeasurementDB(default_manifest_path().with_name("default.measurements.jsonl")).read()
    assert ms, "the recorded H100 database is missing"
    return ms


@pytest.fixture(scope="session")
def artifact_cache(tmp_path_factory) -> ArtifactCache:
    """One compile cache for the whole session (nvcc is slow on 2 cores)."""
    return ArtifactCache(tmp_path_factory.mktemp("artifacts"))


@pytest.fixture(scope="session")
def session_native(
    tmp_path_factory,
) -> native_build.NativeBuild | native_build.NativeUnavailable:
    """The native launcher built once for the session (real g++, nvcc and torch), in a
    cache of its own; NativeUnavailable where this machine cannot build it."""
    return native_build.build_native(ArtifactCache(tmp_path_factory.mktemp("native-artifacts")))


@pytest.fixture(autouse=True)
def _native_once(monkeypatch, session_native) -> None:
    """Every build in the suite ships the session's one native launcher: compiling it
    takes seconds, and most tests build into a fresh cache. The pipeline still calls
    ``build_native`` once per build (logging its line); only the compile is shared.
    A test of the real call puts ``native_build.build_native`` back itself."""

    def shared(cache=None, *, log=None):
        if log is not None:
            log(f"native launcher: {session_native.summary()}")
        return session_native

    monkeypatch.setattr(pipeline_build, "build_native", shared)


@pytest.fixture(scope="session")
def _best_kernel_table(
    recorded_measurements, artifact_cache
) -> tuple[DispatchTable, dict[str, bytes]]:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc to rebuild the recorded cubins")
    best: dict[tuple, Measurement] = {}
    for m in recorded_measurements:
        if m.status == "ok" and not m.is_vendor:
            key = (m.gpu.name, m.target)
            if key not in best or m.median_us < best[key].median_us:
                best[key] = m
    designs = [m.design for m in best.values()]
    built = build_all(designs, artifact_cache)
    for m in best.values():  # the cubin we ship must be the one that was measured
        assert built[m.design_key].artifact_key == m.artifact_key, design_name(m.design)
    sels = [
        Selection(
            gpu, t, "kernel", m, m.median_us, m.baselines_us["torch"], m.spread, m.measured_at, 1
        )
        for (gpu, t), m in best.items()
    ]
    manifest = load_manifest(default_manifest_path())
    return build_table(
        name="recorded",
        version="0.0.1",
        package=package_name("recorded"),
        manifest_sha256=manifest.sha256,
        selections=sels,
        cubin_of=artifact_cache.cubin,
    )


@pytest.fixture
def recorded_table(_best_kernel_table) -> DispatchTable:
    return _best_kernel_table[0]


@pytest.fixture
def recorded_cubins(_best_kernel_table) -> dict[str, bytes]:
    return dict(_best_kernel_table[1])


@pytest.fixture(scope="session")
def _selected_table(
    recorded_measurements, db_recorded_checks, artifact_cache
) -> tuple[DispatchTable, dict]:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc to rebuild the recorded cubins")
    from cudal2.pipeline.build import table_from_measurements

    return table_from_measurements(
        recorded_measurements, "offline", artifact_cache, "selected", db_recorded_checks
    )


@pytest.fixture
def selected_table(_selected_table) -> DispatchTable:
    """The table a build selects from the recorded database (with its H100 sanitizer
    checks): kernel, cublaslt (autotuned cuBLASLt algorithms) and fallback entries."""
    return _selected_table[0]


@pytest.fixture
def selected_cubins(_selected_table) -> dict[str, bytes]:
    return dict(_selected_table[1])


EAGER_STEM = "llama-3.1-8b-hf-h100"  # the manifest that asks for eager alternatives


def eager_selections(m: int | None = 64) -> list[Selection]:
    """The selection of ``llama-3.1-8b-hf-h100`` from its committed database at token
    count ``m`` (None: all), with its manifest's ``eager_host_saving_us``, before the
    sanitizer gate (its eager alternatives have no H100 memcheck on record yet: the
    build ships them once ``ci/gpu_memcheck.sh`` has recorded clean checks)."""
    from cudal2.pipeline.build import believable, latest, shippable
    from cudal2.pipeline.select import select

    manifest = load_manifest(default_manifest_path().with_name(f"{EAGER_STEM}.toml"))
    history = believable(latest(MeasurementDB(committed_db(EAGER_STEM)).load().measurements))
    targets = [t for t in manifest.targets if m is None or t.m == m]
    sels, _ = select(
        targets, history, manifest.timing_mode, shippable(), manifest.eager_host_saving_us
    )
    return sels


@pytest.fixture(scope="session")
def _eager_table(artifact_cache) -> tuple[DispatchTable, dict[str, bytes]]:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc to rebuild the recorded cubins")
    from cudal2.pipeline.gate import shipped_kernels

    sels = eager_selections()
    assert any(s.eager is not None for s in sels), "no eager alternative at M = 64"
    designs = [w.design for w in shipped_kernels(sels)]
    built = build_all(designs, artifact_cache)
    for w in shipped_kernels(sels):  # the cubin we ship must be the one that was measured
        assert built[w.design_key].artifact_key == w.artifact_key, design_name(w.design)
    return build_table(
        name="eager",
        version="0.0.1",
        package=package_name("eager"),
        manifest_sha256="",
        selections=sels,
        cubin_of=artifact_cache.cubin,
    )


@pytest.fixture
def eager_table(_eager_table) -> DispatchTable:
    """The M = 64 table of llama-3.1-8b-hf-h100 (``eager_selections``): cublaslt and
    fallback entries with eager alternatives, from recorded H100 measurements."""
    return _eager_table[0]


@pytest.fixture
def eager_cubins(_eager_table) -> dict[str, bytes]:
    return dict(_eager_table[1])


@pytest.fixture(scope="session")
def shipped_native(session_native) -> native_build.NativeBuild | None:
    """The native launcher the packages of the runtime tests ship: the session's build
    (None where it cannot be built here); with ``CUDAL2_TEST_NATIVE=<folder>``, the
    files found there instead, with the tag and versions of a build's (ci/gpu_native.sh:
    the GPU machine runs the CPU machine's binary, not one built against its own torch)."""
    folder = os.environ.get("CUDAL2_TEST_NATIVE")
    if folder:
        files = {name: (Path(folder) / name).read_bytes() for name in native_build.FILES}
        return native_build.NativeBuild(files, "manylinux_2_34_x86_64", "carried", "", "")
    return session_native if isinstance(session_native, native_build.NativeBuild) else None


@pytest.fixture
def write_package(shipped_native) -> Callable[[Path, DispatchTable, dict[str, bytes]], str]:
    """Installs a table as a generated package under ``root``, through the real wheel
    writer (a wheel is unzipped there, as pip would lay it out) with the native launcher
    where one is built (``shipped_native``), and returns its import name, unique per
    call so that imports never collide."""
    native = shipped_native

    def write(root: Path, table: DispatchTable, cubins: dict[str, bytes]) -> str:
        tag = uuid.uuid4().hex[:12]
        table = dataclasses.replace(table, name=f"t{tag}", package=package_name(f"t{tag}"))
        wheel = write_wheel(table, cubins, root / f"dist-{tag}", native=native)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(root)
        return table.package

    return write
