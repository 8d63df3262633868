"""``cudal2-bench --kernels``: the table it times, from a wheel or from a database."""

from __future__ import annotations

import gzip
import shutil

import pytest

from cudal2.bench.kernels import WheelKernels
from cudal2.generator import design_name
from cudal2.manifest import default_manifest_path
from cudal2.packaging.wheel import write_wheel
from cudal2.pipeline.build import table_from_measurements
from cudal2.pipeline.select import select

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
DB = default_manifest_path().with_name("default.measurements.jsonl")


def test_database_gives_the_table_a_build_would_select(
    recorded_measurements, monkeypatch, tmp_path, db_unchecked
):
    """With the H100's clean sanitizer checks the table's kernels are the selection's;
    without them, none (each waits for a check)."""
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    gpu = recorded_measurements[0].gpu
    k = WheelKernels.open(DB, gpu, "offline")
    sels, missing = select(
        sorted({m.target for m in recorded_measurements}), recorded_measurements, "offline"
    )
    assert missing == []
    assert k.model == gpu.name
    for s in sels:
        d = k.describe(s.target)
        assert d["kind"] == s.kind, s.target.label
        if s.kind == "kernel":  # the winner's cubin came along, by content hash
            e = k.entry(s.target)
            assert e.kernel == design_name(s.winner.design) and e.cubin_sha256 in k.cubins
    assert any(s.kind == "kernel" for s in sels)
    unchecked = WheelKernels.open(db_unchecked("default"), gpu, "offline")
    assert {unchecked.describe(s.target)["kind"] for s in sels} <= {"cublaslt", "fallback"}


def test_wheel_and_database_tables_agree(
    recorded_measurements, db_recorded_checks, monkeypatch, tmp_path
):
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    from cudal2.generator.compile import ArtifactCache

    table, cubins = table_from_measurements(
        recorded_measurements,
        "offline",
        ArtifactCache(tmp_path / "cache"),
        "bench",
        db_recorded_checks,
    )
    gpu = recorded_measurements[0].gpu
    from_wheel = WheelKernels.open(write_wheel(table, cubins, tmp_path / "dist"), gpu)
    from_db = WheelKernels.open(DB, gpu, "offline")
    for m in recorded_measurements:
        assert from_wheel.describe(m.target) == from_db.describe(m.target)


def test_empty_database_is_an_error(tmp_path, recorded_measurements):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no measurements"):
        WheelKernels.open(tmp_path / "empty.jsonl", recorded_measurements[0].gpu)


def test_manifest_gives_its_targets_from_the_databases_it_reuses(
    recorded_measurements, monkeypatch, tmp_path
):
    """A manifest's table: its build's selection from its own database and the ones it
    reuses (here all in a reused ``.jsonl.gz``, its own empty), for its targets only."""
    monkeypatch.setenv("CUDAL2_CACHE", str(tmp_path / "cache"))
    with gzip.open(tmp_path / "reused.measurements.jsonl.gz", "wt") as f:
        f.write(DB.read_text())
    (tmp_path / "m.measurements.jsonl").write_text("")
    (tmp_path / "m.toml").write_text(
        '[package]\nname = "m"\nversion = "0.1.0"\n\n'
        '[build]\ngpus = ["sm_90a"]\ndtypes = ["fp16"]\nlayouts = ["tn"]\n'
        'reuse = ["reused.measurements.jsonl.gz"]\n\n'
        "[[targets]]\nshapes = [[1, 4096, 4096], [16, 4096, 4096]]\n"
    )
    gpu = recorded_measurements[0].gpu
    whole = WheelKernels.open(DB, gpu, "offline")
    packed = WheelKernels.open(tmp_path / "reused.measurements.jsonl.gz", gpu, "offline")
    mine = WheelKernels.open(tmp_path / "m.toml", gpu, "offline")
    targets = sorted({m.target for m in recorded_measurements})
    kept = [t for t in targets if t.dtype == "fp16" and t.layout == "tn" and t.m in (1, 16)]
    assert len(kept) == 2 and {whole.describe(t)["kind"] for t in kept} == {"kernel", "cublaslt"}
    for t in targets:
        assert packed.describe(t) == whole.describe(t), t.label
        want = whole.describe(t) if t in kept else {"kind": "fallback", "reason": "no entry"}
        assert mine.describe(t) == want, t.label


# Hostile --kernels sources, as cudal2-bench's run meets them on a GPU machine: (case,
# the file's name, its text, what the error must say). One line a case.
HOSTILE_KERNELS = [
    ("empty database", "k.jsonl", "", "no measurements"),
    ("not JSON", "k.jsonl", "{not json\n", "no measurements"),
    ("manifest without a package name", "m.toml", "[package]\nname = 3\n", "package.name"),
    ("manifest reusing a missing file", "m.toml", None, "cannot read"),
]


@pytest.mark.parametrize(
    ("case", "name", "text", "says"), HOSTILE_KERNELS, ids=[h[0] for h in HOSTILE_KERNELS]
)
def test_a_bad_kernels_source_is_named_and_exits_2(
    case, name, text, says, recorded_measurements, monkeypatch, tmp_path, capsys
):
    torch = pytest.importorskip("torch")
    from cudal2.bench import run as bench_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # no GPU is reached
    monkeypatch.setattr("cudal2.verify.gpu.current_gpu", lambda: recorded_measurements[0].gpu)
    if text is None:  # a manifest whose [build] reuse names a file that is not there
        (tmp_path / "m.measurements.jsonl").write_text("")
        text = (
            '[package]\nname = "m"\nversion = "0.1.0"\n\n[build]\ngpus = ["sm_90a"]\n'
            'reuse = ["gone.measurements.jsonl.gz"]\n\n[[targets]]\nshapes = [[1, 64, 64]]\n'
        )
    (tmp_path / name).write_text(text)
    out = tmp_path / "r.jsonl"
    args = ([(64, 64, 64)], out, ["offline"], ["fp16"], ["tn"], 3, str(tmp_path / name))
    assert bench_run.run(*args) == 2
    err = capsys.readouterr().err
    assert f"--kernels {tmp_path / name}" in err and says in err, err
    assert not out.exists()
