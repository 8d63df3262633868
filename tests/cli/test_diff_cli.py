"""``cudal2-diff``: output shapes and exit codes."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cudal2.cli.diff import main
from cudal2.packaging.runtime.table import DispatchTable
from cudal2.packaging.wheel import write_wheel


def _write(tmp_path: Path, name: str, table: DispatchTable) -> str:
    path = tmp_path / name
    path.write_bytes(table.to_bytes())
    return str(path)


def _write_raw(tmp_path: Path, name: str, table: dict[str, Any]) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(table))
    return str(path)


def _slowed(table: DispatchTable, factor: float, drop_last: bool = False) -> DispatchTable:
    """``table`` whose first kernel entry takes ``factor`` times as long (and without
    its last entry, with ``drop_last``)."""
    entries = list(table.entries)
    i = next(i for i, e in enumerate(entries) if e.kind == "kernel")
    entries[i] = dataclasses.replace(entries[i], time_us=entries[i].time_us * factor)
    if drop_last:
        entries.pop()
    return dataclasses.replace(table, entries=tuple(entries))


@pytest.fixture
def old_path(recorded_table, tmp_path) -> str:
    return _write(tmp_path, "old.json", recorded_table)


@pytest.fixture
def slower_path(recorded_table, tmp_path) -> str:
    return _write(tmp_path, "slower.json", _slowed(recorded_table, 1.10))


def test_identical_wheels(recorded_table, recorded_cubins, tmp_path, capsys):
    a = write_wheel(recorded_table, recorded_cubins, tmp_path / "a")
    b = write_wheel(recorded_table, recorded_cubins, tmp_path / "b")
    assert main([str(a), str(b)]) == 0
    assert capsys.readouterr().out == "no changes\n"


def test_wheel_against_json(recorded_table, recorded_cubins, tmp_path, slower_path, capsys):
    whl = write_wheel(recorded_table, recorded_cubins, tmp_path / "a")
    assert main([str(whl), slower_path]) == 0
    out = capsys.readouterr().out
    assert "slower +10.0%" in out
    assert out.splitlines()[1].startswith("1 changed")


def test_json_output_shape(recorded_table, tmp_path, old_path, capsys):
    dropped = recorded_table.entries[-1]
    new_path = _write(tmp_path, "new.json", _slowed(recorded_table, 1.10, drop_last=True))
    assert main([old_path, new_path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"added", "removed", "changed", "regressions", "noise", "gate"}
    assert data["gate"] == {
        "armed": False,
        "regression_pct": None,
        "allow_removed": False,
        "failures": [],
    }
    assert data["added"] == []
    assert [(r["m"], r["n"], r["k"]) for r in data["removed"]] == [
        (dropped.m_measured, dropped.n, dropped.k)
    ]
    assert len(data["changed"]) == 1 and data["changed"][0]["reasons"] == ["slower"]
    assert data["regressions"] == data["changed"]


def test_noise_option(old_path, slower_path, capsys):
    assert main([old_path, slower_path, "--noise", "15", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["changed"] == [] and data["regressions"] == []
    assert main([old_path, slower_path, "--noise", "5", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["changed"]) == 1


def test_fail_on_regression(old_path, slower_path, capsys):
    assert main([old_path, slower_path, "--fail-on-regression", "5"]) == 1
    assert capsys.readouterr().err == "cudal2-diff: gate: FAILED at 5%: 1 slower\n"
    assert main([old_path, slower_path, "--fail-on-regression", "20"]) == 0
    # the regression gate does not depend on the noise threshold
    assert main([old_path, slower_path, "--noise", "15", "--fail-on-regression", "5"]) == 1
    # without the option a regression does not fail the run
    assert main([old_path, slower_path]) == 0


def test_faster_never_fails(recorded_table, tmp_path, old_path):
    faster = _write(tmp_path, "faster.json", _slowed(recorded_table, 0.5))
    assert main([old_path, faster, "--fail-on-regression", "0"]) == 0


def test_missing_file_exits_2(old_path, tmp_path, capsys):
    missing = tmp_path / "missing.whl"
    assert main([old_path, str(missing)]) == 2
    err = capsys.readouterr().err
    assert "cudal2-diff: error:" in err and str(missing) in err and "no such file" in err


def test_not_a_wheel_exits_2(old_path, tmp_path, capsys):
    fake = tmp_path / "cudal2_kernels_x-0.1.0-py3-none-any.whl"
    fake.write_text("not a zip")
    assert main([str(fake), old_path]) == 2
    assert "not a readable wheel" in capsys.readouterr().err


def test_bad_table_exits_2(recorded_table, tmp_path, old_path, capsys):
    bad = _write_raw(tmp_path, "bad.json", dict(recorded_table.as_json(), format=99))
    assert main([old_path, bad]) == 2
    assert "unsupported 'format'" in capsys.readouterr().err
    raw = recorded_table.as_json()
    del raw["entries"][0]["time_us"]
    assert main([old_path, _write_raw(tmp_path, "bad2.json", raw)]) == 2
    assert "bad2.json: entries[0]: missing key 'time_us'" in capsys.readouterr().err


def test_negative_percent_is_a_usage_error(old_path, capsys):
    assert main([old_path, old_path, "--noise", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--noise" in err and len(err.splitlines()) == 1


def test_help_documents_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    epilog = out[out.index("exit status:") :]
    for code, meaning in (("0", "no gate failure"), ("1", "the gate failed"), ("2", "bad input")):
        assert f"  {code}  {meaning}" in epilog
    for option in ("--format", "--allow-removed", "--fail-on-regression", "--max-rows"):
        assert option in out


def test_removal_fails_the_gate_unless_allowed(recorded_table, tmp_path, old_path, capsys):
    fewer = _write(tmp_path, "fewer.json", _slowed(recorded_table, 1.0, drop_last=True))
    assert main([old_path, fewer]) == 0  # a report, not a gate
    assert main([old_path, fewer, "--fail-on-regression", "5"]) == 1
    assert capsys.readouterr().err == "cudal2-diff: gate: FAILED at 5%: 1 removed\n"
    assert main([old_path, fewer, "--fail-on-regression", "5", "--allow-removed"]) == 0
    assert "gate: passed at 5% (removals allowed)" in capsys.readouterr().out


def test_formats(recorded_table, tmp_path, old_path, slower_path, capsys):
    assert main([old_path, slower_path, "--format", "markdown", "--fail-on-regression", "5"]) == 1
    md = capsys.readouterr().out
    assert md.startswith("### cudal2-diff: A `old.json` → B `slower.json`")
    assert "| slower +10.0% |" in md
    assert main([old_path, slower_path, "--format", "json"]) == 0
    as_format = capsys.readouterr().out
    assert main([old_path, slower_path, "--json"]) == 0
    assert capsys.readouterr().out == as_format
    assert main([old_path, slower_path, "--format", "html"]) == 2
    assert "--format" in capsys.readouterr().err


# -- the gate on real tables: built from the committed H100 databases ------------------------


def _table(stem: str, cache, drop=lambda line: False, keep=lambda target: True):
    """The table a CPU build makes from committed database ``stem`` (its lines for which
    ``drop`` holds left out; only targets ``keep`` holds)."""
    from cudal2.database import MeasurementDB, default_database
    from cudal2.manifest import default_manifest_path
    from cudal2.pipeline.build import table_from_measurements

    src = default_database(default_manifest_path().with_name(f"{stem}.toml"))
    raw = gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes()
    copy = cache.root.parent / f"{stem}-{uuid.uuid4().hex[:8]}.jsonl"
    copy.write_text("".join(x for x in raw.decode().splitlines(True) if not drop(x)))
    db = MeasurementDB(copy).load()
    history = [m for m in db.measurements if keep(m.target)]
    return table_from_measurements(history, "offline", cache, stem, db.checks)[0]


def _fp16_tn_m1_clean_check(line: str) -> bool:
    """The H100's clean memcheck lines at the default table's fp16/tn M=1 target (of its
    kernel, and of the one that kernel displaced when kernels came to be ranked by
    speedup)."""
    r = json.loads(line)
    t = r.get("target", {})
    return (r.get("record"), r.get("event"), t.get("dtype"), t.get("layout"), t.get("m")) == (
        "sanitizer_check",
        "clean",
        "fp16",
        "tn",
        1,
    )


@pytest.fixture(scope="module")
def real_tables(tmp_path_factory) -> dict[str, DispatchTable]:
    """``as_committed``: the default database's table. ``replaced``: from a copy without
    the clean memcheck line of its fp16/tn M=1 kernel, which then may not ship: the next
    checked candidate takes that target. ``fallback_a`` / ``fallback_b``: the targets of
    N = K = 4096 that fall back in both the default and the llm-public database's table
    (two measuring runs of torch)."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc to rebuild the recorded cubins")
    from cudal2.generator.compile import ArtifactCache

    cache = ArtifactCache(tmp_path_factory.mktemp("diff-real") / "cache")
    shared = lambda t: (t.n, t.k) == (4096, 4096)  # noqa: E731
    default = _table("default", cache)
    public = _table("llm-public-h100", cache, keep=shared)
    both = {e.key for e in public.entries if e.kind == "fallback"} & {
        e.key for e in default.entries if e.kind == "fallback"
    }

    def only(table: DispatchTable) -> DispatchTable:
        return dataclasses.replace(table, entries=tuple(e for e in table.entries if e.key in both))

    return {
        "as_committed": default,
        "replaced": _table("default", cache, drop=_fp16_tn_m1_clean_check),
        "fallback_a": only(default),
        "fallback_b": only(public),
    }


def test_real_removal_fails_the_gate(real_tables, tmp_path, capsys):
    """A target removed from the manifest (the unaligned 100x1000x1000 shape)."""
    table = real_tables["as_committed"]
    kept = tuple(e for e in table.entries if (e.n, e.k) != (1000, 1000))
    assert len(table.entries) - len(kept) == 4
    old = _write(tmp_path, "old.json", table)
    new = _write(tmp_path, "new.json", dataclasses.replace(table, entries=kept))
    assert main([old, new, "--fail-on-regression", "5"]) == 1
    assert capsys.readouterr().err == "cudal2-diff: gate: FAILED at 5%: 4 removed\n"
    assert main([old, new, "--fail-on-regression", "5", "--allow-removed"]) == 0


def test_real_regression_fails_the_gate(real_tables, tmp_path, capsys):
    """The fp16/tn M=1 kernel may not ship: a cuBLASLt algorithm takes its target,
    12.8% slower relative to the torch of its own run."""
    old = _write(tmp_path, "old.json", real_tables["as_committed"])
    new = _write(tmp_path, "new.json", real_tables["replaced"])
    assert main([old, new, "--fail-on-regression", "5", "--allow-removed", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    [row] = data["gate"]["failures"]
    assert (row["gate"], row["dtype"], row["layout"], row["m"]) == ("slower", "fp16", "tn", 1)
    assert (row["before"]["kind"], row["after"]["kind"]) == ("kernel", "cublaslt")
    assert row["rel_pct"] == pytest.approx(12.8, abs=0.05)
    assert main([old, new, "--fail-on-regression", "15"]) == 0
    # pasteable: the text report of a real kernel -> cuBLASLt move has no very long line
    assert main([old, new]) == 0
    text = capsys.readouterr().out
    assert "->cublaslt +12.8%" in text
    assert max(len(line) for line in text.splitlines()) < 150


def test_real_fallback_noise_never_fails_the_gate(real_tables, tmp_path, capsys):
    """Torch's time on two measuring runs, for targets that fall back in both."""
    a, b = real_tables["fallback_a"], real_tables["fallback_b"]
    assert a.entries and {e.kind for e in (*a.entries, *b.entries)} == {"fallback"}
    moves = [
        abs(y.time_us / x.time_us - 1) * 100 for x, y in zip(a.entries, b.entries, strict=True)
    ]
    assert max(moves) > 1.0  # a real move, past the noise threshold given below
    old, new = _write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b)
    assert main([old, new, "--fail-on-regression", "0", "--noise", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gate"]["failures"] == [] and data["regressions"] == []
    assert data["changed"] == [] and len(data["noise"]) == sum(m > 1.0 for m in moves)


def test_the_build_table_and_the_diff_name_entries_alike(selected_table, tmp_path, capsys):
    """One naming scheme: each entry's row in the build's printed table carries the same
    dispatch label and M range as its row in the diff (here: every target removed)."""
    from cudal2.cli.build import _summary

    build_rows = _summary(SimpleNamespace(table=selected_table, selections=[])).splitlines()[1:-1]
    empty = dataclasses.replace(selected_table, gpu_models=(), archs=(), entries=())
    old = _write(tmp_path, "old.json", selected_table)
    assert main([old, _write(tmp_path, "empty.json", empty), "--max-rows", "0"]) == 0
    diff_rows = [
        x.split() for x in capsys.readouterr().out.splitlines() if x.startswith("  removed")
    ]
    assert len(build_rows) == len(diff_rows) == len(selected_table.entries)
    for e, build, diff in zip(selected_table.entries, build_rows, diff_rows, strict=True):
        assert {e.label, e.m_range} <= set(build.split()) & set(diff), (build, diff)


def test_the_committed_diff_demo_is_what_its_script_gives(tmp_path):
    """bench/results/diff-demo.md (real wheels built on CPU from the committed databases,
    and the gate's exit codes) is the script's output, never edited by hand."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc to rebuild the recorded cubins")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "diff-demo.md"
    subprocess.run(
        ["bash", "bench/experiments/diff_demo.sh", str(out)], cwd=root, env=env, check=True
    )
    assert out.read_text() == (root / "bench/results/diff-demo.md").read_text()
