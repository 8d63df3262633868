"""nvcc -> sm_90a cubins into the content-addressed cache (one variant per dtype x layout)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudal2.generator import compile as comp
from cudal2.generator import design_name
from cudal2.generator.compile import ArtifactCache, artifact_key_of, build, build_all
from cudal2.generator.families import sm80_mma
from cudal2.records import KernelDesign

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def _d(dtype, layout) -> KernelDesign:
    return sm80_mma.design("sm_90a", dtype, layout, 64, 64, 32, 2, 2, 3)


def test_one_variant_per_dtype_layout_compiles_in_parallel(tmp_path):
    cache = ArtifactCache(tmp_path)
    designs = [_d(dt, lay) for dt in ("fp16", "bf16") for lay in ("tn", "nn")]
    results = build_all(designs, cache, jobs=2)
    assert set(results) == {d.key for d in designs}
    for d in designs:
        r = results[d.key]
        assert r.ok, r.error
        assert r.symbol == design_name(d) and r.spill_bytes == 0 and 0 < r.registers <= 255
        assert r.artifact_key == artifact_key_of(d)
        entry = cache.entry(r.artifact_key)
        cubin = (entry / "kernel.cubin").read_bytes()
        assert cubin[:4] == b"\x7fELF"  # a real device ELF
        assert design_name(d).encode() in cubin  # the extern "C" symbol is in it
        assert json.loads((entry / "build.json").read_text())["ok"] is True
        assert "sm_90a" in " ".join(r.flags)
    # no temporary folders left behind
    assert not [p for p in tmp_path.rglob(".*") if p.is_dir()]


def test_second_build_recompiles_nothing(tmp_path, monkeypatch):
    cache = ArtifactCache(tmp_path)
    first = build(_d("fp16", "tn"), cache)

    def no_nvcc(*a, **k):
        raise AssertionError("nvcc ran on a cache hit")

    monkeypatch.setattr(comp.nvcc, "run_guarded", no_nvcc)
    assert build(_d("fp16", "tn"), cache) == first


def test_compile_error_is_recorded_not_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(comp, "render", lambda d: "this is not CUDA;\n")
    cache = ArtifactCache(tmp_path)
    r = build(_d("bf16", "nn"), cache)
    assert not r.ok and "error" in r.error.lower()
    assert cache.get(r.artifact_key) == r
    assert not (cache.entry(r.artifact_key) / "kernel.cubin").exists()


def test_nvcc_runs_niced_and_its_error_is_still_recorded(tmp_path, monkeypatch):
    """build_all runs nvcc at a raised niceness (below the build's measuring threads):
    an nvcc stand-in prints the niceness it runs at and fails; the build records that
    text as the compile error, as it records nvcc's own."""
    comp.nvcc_version()  # the real nvcc's version, cached: the key stays what it is
    fake = tmp_path / "nvcc"
    fake.write_text(
        f"#!{sys.executable}\nimport os, sys\n"
        "print(f'kernel.cu(1): error: niceness {os.nice(0)}', file=sys.stderr)\nsys.exit(1)\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(comp, "_nvcc", lambda: str(fake))
    res = build_all([_d("fp16", "nn")], ArtifactCache(tmp_path / "cache"), jobs=1)
    (r,) = res.values()
    niced = min(os.nice(0) + comp.NVCC_NICENESS, 19)
    assert not r.ok and f"error: niceness {niced}" in r.error
    assert comp.NVCC_NICENESS > 0
    plain = build_all([_d("bf16", "nn")], ArtifactCache(tmp_path / "other"), niceness=0)
    assert f"error: niceness {os.nice(0)}" in next(iter(plain.values())).error


def test_a_cubin_does_not_depend_on_where_its_cache_is(tmp_path):
    """-lineinfo puts the source's path and mtime in the cubin; the source is compiled at
    one fixed place, so two caches hold the same bytes (issue 17, item 3)."""
    d = _d("fp16", "tn")
    a, b = ArtifactCache(tmp_path / "one"), ArtifactCache(tmp_path / "elsewhere" / "two")
    ra, rb = build(d, a), build(d, b)
    assert ra == rb and ra.cubin_sha256 == comp.sha256_hex(a.cubin(ra.artifact_key))
    assert a.cubin(ra.artifact_key) == b.cubin(rb.artifact_key)
    assert str(tmp_path).encode() not in a.cubin(ra.artifact_key)
    assert list((tmp_path / "one" / "tmp").iterdir()) == []  # compile folders are removed


def test_a_killed_compile_is_not_recorded(tmp_path, monkeypatch):
    """A compile stopped by the build (its group killed) says nothing of the source."""
    killed = comp.nvcc.NvccRun(-9, "", "")
    monkeypatch.setattr(comp.nvcc, "run_guarded", lambda *a, **k: killed)
    cache = ArtifactCache(tmp_path)
    with pytest.raises(comp.CompileInterruptedError):
        build(_d("fp16", "nn"), cache)
    assert cache.get(artifact_key_of(_d("fp16", "nn"))) is None


def test_a_build_sweeps_the_source_folders_killed_builds_left(tmp_path, monkeypatch):
    """A source folder of a key no later build compiles is removed all the same."""
    monkeypatch.setattr(comp.nvcc, "SOURCE_ROOT", tmp_path / "src")
    stale = tmp_path / "src" / ("ab" * 32)
    stale.mkdir(parents=True)
    (stale / "kernel.cu").write_text("left by a killed build")
    build_all([_d("fp16", "tn")], ArtifactCache(tmp_path / "cache"))
    assert list((tmp_path / "src").iterdir()) == []


def test_nvcc_through_a_symlinked_cuda_folder_makes_the_same_bytes(tmp_path, monkeypatch):
    """The GPU machine finds nvcc as /usr/local/cuda/bin/nvcc (a symlinked folder), this
    one as /usr/local/cuda-13.0/bin/nvcc: -lineinfo writes the header folder nvcc was
    run from into the cubin, so both must run it by its real path."""
    # nvcc's own folder (PATH may hold a wrapper script, as on this machine)
    (tmp_path / "e.cu").write_text("")
    dry = subprocess.run(
        [comp._nvcc(), "-dryrun", "-cubin", str(tmp_path / "e.cu"), "-o", str(tmp_path / "e")],
        capture_output=True,
        text=True,
    )
    here = next(ln.split("=", 1)[1] for ln in dry.stderr.splitlines() if "_HERE_=" in ln)
    link = tmp_path / "cuda"
    link.symlink_to(Path(here).resolve().parent, target_is_directory=True)
    direct = build(_d("fp16", "tn"), ArtifactCache(tmp_path / "direct"))
    monkeypatch.setenv("PATH", f"{link / 'bin'}:{os.environ['PATH']}")
    assert shutil.which("nvcc") == str(link / "bin" / "nvcc")
    linked = build(_d("fp16", "tn"), ArtifactCache(tmp_path / "linked"))
    assert linked.cubin_sha256 == direct.cubin_sha256
