"""cudal2-build on a machine without a GPU: from the recorded database to a wheel."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import sys
import zipfile

import pytest

from cudal2.cli import build as build_cli
from cudal2.cli import diff as diff_cli
from cudal2.database import default_database
from cudal2.generator import design_name
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.packaging.runtime.table import DispatchTable

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])


def _sha(p):
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_default_build_twice_is_byte_identical_and_diffs_clean(
    tmp_path, no_gpu, artifact_cache, capsys
):
    wheels = []
    for i in range(2):
        out = tmp_path / f"out{i}"
        assert build_cli.main(["--out", str(out), "--cache", str(artifact_cache.root)]) == 0
        (w,) = out.glob("cudal2_kernels_default-0.1.0-py3-none-*.whl")
        wheels.append(w)
    assert _sha(wheels[0]) == _sha(wheels[1])
    text = capsys.readouterr().out
    assert "own kernels" in text and "wheel:" in text
    with zipfile.ZipFile(wheels[0]) as z:
        names = z.namelist()
        table = DispatchTable.from_bytes(z.read("cudal2_kernels_default/dispatch.json"))
    cubins = {n for n in names if n.startswith("cudal2_kernels_default/cubins/")}
    shipped = {
        f"cudal2_kernels_default/cubins/{e.cubin_sha256}.cubin"
        for e in table.entries
        if e.kind == "kernel"
    }
    assert cubins == shipped
    assert len(table.entries) == 32  # every default target was measured
    assert diff_cli.main([str(wheels[0]), str(wheels[1]), "--fail-on-regression", "0"]) == 0
    assert "no changes" in capsys.readouterr().out


def test_bad_key_exits_2_naming_it_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(default_manifest_path().read_text().replace("candidates =", "candidatez ="))
    assert build_cli.main([str(bad), "--out", str(tmp_path / "dist")]) == 2
    assert "search.candidatez" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]


def test_no_gpu_and_no_measurements_is_a_clear_error(tmp_path, no_gpu, capsys):
    """A new shape on a machine without a GPU: exit 3 (distinct, so CI can route it to a
    GPU or split the build), the message naming the database and the way on."""
    m = tmp_path / "fresh.toml"
    m.write_text(default_manifest_path().read_text())
    assert (
        build_cli.main([str(m), "--out", str(tmp_path / "dist")]) == build_cli.EXIT_NO_RECORDS == 3
    )
    err = capsys.readouterr().err
    assert "no GPU" in err and "fresh.measurements.jsonl" in err and "docs/ci.md" in err
    assert not (tmp_path / "dist").exists()


def test_help_documents_the_exit_codes_and_the_split(capsys):
    with pytest.raises(SystemExit):
        build_cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "3 no GPU here and no recorded measurement" in text
    for flag in (
        "--dry-run",
        "--export-job",
        "--measure-job",
        "--list-targets",
        ".jsonl.gz",
        "--no-native",
    ):
        assert flag in text


def test_unknown_proposer_flag_is_refused(tmp_path, capsys):
    assert build_cli.main([str(default_manifest_path()), "--proposer", "bayes"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bayes'" in err and err.count("\n") == 1


def test_console_scripts_are_installed():
    bindir = shutil.which("cudal2-build") or ""
    assert bindir, f"cudal2-build not on PATH for {sys.executable}"
    assert shutil.which("cudal2-diff")


def test_recorded_design_that_is_no_longer_legal_is_not_shipped(
    tmp_path, no_gpu, artifact_cache, recorded_measurements, capsys
):
    import dataclasses

    from cudal2.database import MeasurementDB

    # The recorded database with every design of one target made illegal (bm=24: no
    # family has such a tile), and its cuBLASLt record left out (it would be next).
    victim = next(m.target for m in recorded_measurements if m.status == "ok")

    def illegal(m):
        design = m.design.replace(bm=24)
        return dataclasses.replace(m, design=design, design_key=design.key)

    changed = [
        illegal(m) if m.target == victim else m
        for m in recorded_measurements
        if not (m.target == victim and m.is_vendor)
    ]
    db = tmp_path / "old.jsonl"
    MeasurementDB(db).append(changed)
    out = tmp_path / "dist"
    args = ["--measurements", str(db), "--out", str(out), "--cache", str(artifact_cache.root)]
    assert build_cli.main(args) == 0
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        table = DispatchTable.from_bytes(z.read("cudal2_kernels_default/dispatch.json"))
    (entry,) = [
        e
        for e in table.entries
        if (e.dtype, e.layout, e.n, e.k, e.m_measured)
        == (victim.dtype, victim.layout, victim.n, victim.k, victim.m)
    ]
    assert entry.kind == "fallback"


def test_llm_public_builds_from_its_recorded_database(tmp_path, no_gpu, artifact_cache, capsys):
    """The committed H100 database (with the H100's sanitizer checks) rebuilds the
    wheel it was measured for: the same own kernels (their sources still compile to the
    measured artifacts), every target covered. Three sm90tma designs measured before
    the templates changed no longer build to their measured artifacts (the log says so);
    none of them would win its target, so the wheel loses nothing."""
    from cudal2.database import MeasurementDB, latest
    from cudal2.manifest import load_manifest
    from cudal2.pipeline.build import shippable
    from cudal2.pipeline.select import select

    manifest = default_manifest_path().with_name("llm-public-h100.toml")
    db = tmp_path / "llm-public-h100.measurements.jsonl"  # a build may append to it
    db.write_bytes(gzip.decompress(manifest.with_name(db.name + ".gz").read_bytes()))
    out = tmp_path / "out"
    args = [str(manifest), "--measurements", str(db), "--out", str(out)]
    assert build_cli.main([*args, "--cache", str(artifact_cache.root)]) == 0
    err = capsys.readouterr().err
    # The build log is captured (it once went to the sys.stderr of import time, and
    # an assertion that it lacked a message could not fail). 3 recorded designs no
    # longer build to their measured artifact (template or nvcc changed since): the
    # log says so, and none of them is a winner (the set of own kernels below is that
    # of the selection over every record).
    assert "no GPU here: replaying" in err
    assert "3 measured designs no longer build to the measured artifact" in err
    (w,) = out.glob("cudal2_kernels_llm_public_h100-*.whl")
    with zipfile.ZipFile(w) as z:
        table = DispatchTable.from_bytes(z.read("cudal2_kernels_llm_public_h100/dispatch.json"))
    m = load_manifest(manifest)
    history = latest(MeasurementDB(db, m.reuse).read())  # and the sweeps it reuses
    sels, missing = select(m.targets, history, "offline")
    assert missing == [] and len(table.entries) == len(m.targets) == 96  # fp16 + bf16
    own = {e.kernel for e in table.entries if e.kind == "kernel"}
    assert own == {design_name(s.winner.design) for s in sels if s.kind == "kernel"}
    usable = shippable()
    targets = set(m.targets)
    stale = {
        x.design_key
        for x in history
        if x.status == "ok" and not x.is_vendor and x.target in targets and not usable(x)
    }
    assert len(stale) == 3  # the log's count: the same rule
    assert not stale & {s.winner.design_key for s in sels if s.winner}  # no winner lost
    families = {k.split("_")[1] for k in own}
    assert "sm90tma" in families
    assert families <= {"sm90csk", "sm90direct", "sm90stream", "sm90tma"}
    assert {e.dtype for e in table.entries if e.kind == "kernel"} == {"fp16", "bf16"}


SHIPPED = sorted(default_manifest_path().parent.glob("*.toml"))


@pytest.mark.parametrize("manifest", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_every_shipped_manifest_builds_on_cpu_from_what_ships(
    manifest, tmp_path, no_gpu, artifact_cache, capsys
):
    """Each shipped manifest, with no argument but the manifest, builds on a machine
    without a GPU from the database that ships beside it (llama-3.1-8b-h100: its H100
    policy build, ``.jsonl.gz``, which a replay must not try to append to), and leaves
    that database as it was. The grid proposer stands in for the policy (about 150 s on
    CPU for llama-3.1-8b-h100's four rounds): the selection reads every record of the
    manifest's targets whichever proposer replays the search."""
    db = default_database(manifest)
    assert db.is_file(), f"{manifest.name}: no database ships beside it"
    before = _sha(db)
    out = tmp_path / "dist"
    argv = [str(manifest), "--out", str(out), "--cache", str(artifact_cache.root)]
    assert build_cli.main([*argv, "--proposer", "grid"]) == 0, capsys.readouterr().err
    assert len(list(out.glob("*.whl"))) == 1
    assert _sha(db) == before


def test_a_build_reads_the_databases_its_manifest_reuses(tmp_path, no_gpu, artifact_cache, capsys):
    """``[build] reuse``: a manifest with no database of its own builds, from the one it
    reuses, the dispatch table a build over that database makes, and writes to neither;
    a reused database that is not there exits 2 naming the key."""
    src = default_manifest_path()
    recorded = src.with_name("default.measurements.jsonl")
    before = _sha(recorded)
    manifest = tmp_path / "reusing.toml"
    text = src.read_text()
    assert text.count("[build]\n") == 1
    manifest.write_text(text.replace("[build]\n", f"[build]\nreuse = ['{recorded}']\n"))
    tables = []
    for argv in (
        [str(src), "--measurements", str(recorded)],
        [str(manifest)],  # its own database, reusing.measurements.jsonl, absent
    ):
        out = tmp_path / f"out{len(tables)}"
        argv += ["--out", str(out), "--cache", str(artifact_cache.root)]
        assert build_cli.main(argv) == 0, capsys.readouterr().err
        (w,) = out.glob("*.whl")
        with zipfile.ZipFile(w) as z:
            (name,) = [n for n in z.namelist() if n.endswith("/dispatch.json")]
            tables.append(DispatchTable.from_bytes(z.read(name)))
    assert "and 1 reused databases" in capsys.readouterr().err
    assert tables[0].entries == tables[1].entries and len(tables[1].entries) == 32
    assert not (tmp_path / "reusing.measurements.jsonl").exists()
    assert _sha(recorded) == before
    manifest.write_text(text.replace("[build]\n", "[build]\nreuse = ['gone.jsonl']\n"))
    assert build_cli.main([str(manifest), "--out", str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert "build.reuse[0] = 'gone.jsonl': cannot read" in err and err.count("\n") == 1


def test_measurements_reads_gzip(tmp_path, no_gpu, artifact_cache, capsys):
    import gzip

    src = default_manifest_path().with_name("default.measurements.jsonl")
    gz = tmp_path / "default.measurements.jsonl.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    wheels = []
    for db, out in ((src, tmp_path / "plain"), (gz, tmp_path / "gz")):
        argv = ["--measurements", str(db), "--out", str(out), "--cache", str(artifact_cache.root)]
        assert build_cli.main(argv) == 0
        wheels += list(out.glob("*.whl"))
    assert _sha(wheels[0]) == _sha(wheels[1])


def test_a_gzipped_database_on_a_gpu_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """A build that would measure (a GPU is here) into a read-only ``.gz`` (the shipped
    llm-public database beside its manifest) exits 2 at once, naming the file and what to
    do, with nothing compiled or written; ``--no-measure`` packages it."""
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: ["NVIDIA H100 80GB HBM3"])
    made = []
    monkeypatch.setattr("cudal2.pipeline.build.make_runner", lambda *a: made.append(a))
    manifest = default_manifest_path().with_name("llm-public-h100.toml")
    cache, out = tmp_path / "cache", tmp_path / "out"
    argv = [str(manifest), "--out", str(out), "--cache", str(cache)]
    assert build_cli.main(argv) == 2
    err = capsys.readouterr().err
    db = default_database(manifest)
    assert db.name == "llm-public-h100.measurements.jsonl.gz"
    assert f"{db}: a gzipped database is read-only and this build measures" in err
    assert "--no-measure" in err and err.count("\n") == 1
    assert made == [] and not out.exists() and not any(cache.rglob("*.cubin"))


def test_dry_run_writes_nothing_and_says_what_a_build_would_do(tmp_path, capsys):
    import json

    m = tmp_path / "fresh.toml"
    m.write_text(default_manifest_path().read_text())
    cache = tmp_path / "cache"
    assert build_cli.main([str(m), "--dry-run", "--json", "--cache", str(cache)]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["targets"] == 32 and sum(s["groups"].values()) == 32
    assert len(s["target_list"]) == 32 and s["phase"] == "round 1/1"
    per_target = load_manifest(m).search.candidates
    assert s["candidates"] == s["per_round"] == 32 * per_target
    assert s["cubins_to_compile"] == s["cubins"] > 0
    assert 0 < s["gpu_s_next"] <= s["budget_s"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh.toml"]  # nothing written
    assert build_cli.main([str(m), "--list-targets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 32 and lines[0].startswith("sm_90a ")


# -- the native launcher (cudal2.packaging.native_build) -------------------------------


@pytest.fixture
def real_native(monkeypatch):
    """The pipeline's real ``build_native`` (the suite shares one build), counted."""
    from cudal2.packaging import native_build
    from cudal2.pipeline import build as pipeline_build

    calls = []

    def counted(*args, **kwargs):
        calls.append(args)
        return native_build.build_native(*args, **kwargs)

    monkeypatch.setattr(pipeline_build, "build_native", counted)
    return calls


def _package_build(tmp_path, cache, *extra):
    out = tmp_path / "out"
    args = [str(default_manifest_path()), "--no-measure", "--out", str(out)]
    rc = build_cli.main([*args, "--cache", str(cache), *extra])
    return rc, sorted(out.glob("*.whl")) if out.exists() else []


def test_the_build_ships_the_native_launcher_built_once(
    tmp_path, no_gpu, artifact_cache, real_native, session_native, capsys
):
    from cudal2.packaging.native_build import NativeUnavailable

    if isinstance(session_native, NativeUnavailable):
        pytest.skip(session_native.reason)
    rc, wheels = _package_build(tmp_path, artifact_cache.root)
    assert rc == 0 and len(real_native) == 1
    (whl,) = wheels
    assert whl.name == f"cudal2_kernels_default-0.1.0-py3-none-{session_native.platform_tag}.whl"
    err = capsys.readouterr().err
    assert f"native launcher: {session_native.summary()}\n" in err
    with zipfile.ZipFile(whl) as z:
        for name, data in session_native.files.items():  # another cache, the same bytes
            assert z.read(f"cudal2_kernels_default/_native/{name}") == data


def test_no_native_ships_the_pure_wheel(tmp_path, no_gpu, artifact_cache, real_native, capsys):
    rc, wheels = _package_build(tmp_path, artifact_cache.root, "--no-native")
    assert rc == 0 and real_native == []
    assert [w.name for w in wheels] == ["cudal2_kernels_default-0.1.0-py3-none-any.whl"]
    with zipfile.ZipFile(wheels[0]) as z:
        assert not [n for n in z.namelist() if "_native" in n]
    err = capsys.readouterr().err
    assert "native launcher: not built (--no-native); the wheel is pure Python\n" in err


def test_a_machine_that_cannot_build_it_ships_a_pure_wheel(
    tmp_path, no_gpu, artifact_cache, real_native, monkeypatch, capsys
):
    from cudal2.packaging import native_build

    real = native_build._which
    monkeypatch.setattr(native_build, "_which", lambda t: None if t == "g++" else real(t))
    rc, wheels = _package_build(tmp_path, artifact_cache.root)
    assert rc == 0 and len(real_native) == 1
    assert [w.name for w in wheels] == ["cudal2_kernels_default-0.1.0-py3-none-any.whl"]
    err = capsys.readouterr().err
    assert "native launcher: not built (no g++ on PATH); the wheel is pure Python\n" in err


def test_a_launcher_that_does_not_compile_fails_the_build(
    tmp_path, no_gpu, artifact_cache, real_native, session_native, monkeypatch, capsys
):
    from cudal2.packaging import native_build

    if isinstance(session_native, native_build.NativeUnavailable):
        pytest.skip(session_native.reason)
    sources = native_build.native_sources()
    broken = {**sources, "launcher.cpp": b"#error the lead broke it\n"}
    monkeypatch.setattr(native_build, "native_sources", lambda: broken)
    rc, wheels = _package_build(tmp_path, artifact_cache.root)
    assert rc == 1 and wheels == []
    err = capsys.readouterr().err
    assert "cudal2-build: error: g++ failed on launcher.cpp" in err
    assert "the lead broke it" in err and "--no-native" in err
