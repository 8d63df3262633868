"""Database faults (issue 17): a measurement database that cannot lie by omission.

Every case is one line of a table and asserts its exact outcome: which line is
skipped and why (the warning names the file and the line), what the build log counts,
the exit code and message of ``cudal2-build``, and what the build then selects.

The data is the committed H100 database of the default manifest. The build is the
CPU build (a replay of the database) of the default manifest cut to one target,
fp16/tn 1x4096x4096, where that database ships a kernel: ``W1`` (the fastest) wins and
``W2`` (the next, also faster than torch beyond its noise) is what the target takes
when W1 cannot ship. Every kernel of the target gets a clean compute-sanitizer check
(a started line and its clean verdict): STANDING IN FOR THE H100 MEMCHECK RUN, so that
a case's outcome is decided by the case alone.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import re
import shutil
import signal
import socket
import stat
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

from cudal2.cli import build as build_cli
from cudal2.database import (
    MAX_LINE_BYTES,
    MAX_WARNINGS,
    DatabaseError,
    MeasurementDB,
    Skipped,
    latest,
)
from cudal2.generator.compile import ArtifactCache
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.pipeline.build import Build
from cudal2.pipeline.select import _fastest, noise, select
from cudal2.records import (
    CheckEvent,
    CheckKey,
    JobKind,
    JobResult,
    Measurement,
    SanitizerCheck,
    Status,
    Target,
)
from cudal2.verdicts import Gate, SanitizerLedger
from cudal2.verify.replay import ReplayRunner

MANIFEST = default_manifest_path()
DB = MANIFEST.with_name("default.measurements.jsonl")
# The measurement lines (the committed file also holds the H100's sanitizer check lines).
LINES = [x for x in DB.read_text().splitlines() if json.loads(x).get("record") != "sanitizer_check"]
RECORDS = MeasurementDB(DB).read()
TARGET = Target("sm_90a", "fp16", "tn", 1, 4096, 4096)
OTHER = Target("sm_90a", "fp16", "tn", 16, 4096, 4096)  # another target W1's artifact runs
AT = "2020-01-01T08:00:00Z"  # when the case's check lines were written (before any run)
LATER = "2020-01-01T09:00:00Z"
# The target's records, as committed (line text), in file order: the standing record of
# each reuse key (the build profiled its best candidates: the profiled copy stands, and
# the earlier one is left out, so that a case about W1's line is about W1).
_STANDING = {id(m) for m in latest(m for m in RECORDS if m.target == TARGET)}
ROWS = [(line, m) for line, m in zip(LINES, RECORDS, strict=True) if id(m) in _STANDING]
# The selection's pick among the target's kernels (``_fastest``), then its pick without it.
_KERNELS = [m for _, m in ROWS if m.status == Status.OK and not m.is_vendor]
W1 = _fastest(_KERNELS)
_OTHERS = [m for m in _KERNELS if m is not W1]
W2 = _fastest(_OTHERS)
W1_LINE = next(line for line, m in ROWS if m is W1)
# A build renders designs for their artifact keys, which name the nvcc version.
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="artifact keys need nvcc")


def _speedup(m: Measurement) -> float:
    return m.baselines_us["torch"] / m.median_us


def test_the_setup_is_what_the_cases_assume():
    assert len(ROWS) == 21 and W1.gpu.name == "NVIDIA H100 80GB HBM3"
    assert len({m.reuse_key for _, m in ROWS}) == len(ROWS)
    for w in (W1, W2):  # both beat torch beyond their noise: W2 is W1's understudy
        assert _speedup(w) - 1 > noise(w)
    assert W1.design_key != W2.design_key and W1.artifact_key != W2.artifact_key


# -- building blocks --------------------------------------------------------------------
def _check(
    event: str, n: int, *, target=TARGET, gpu=None, toolchain=None, at=AT, m=W1
) -> SanitizerCheck:
    return SanitizerCheck(
        f"{n:032x}",
        CheckEvent(event),
        gpu or m.gpu.name,
        toolchain or m.toolchain,
        m.artifact_key,
        target,
        at,
        "0.1.0",
        "memcheck exited 86:\nInvalid __global__ write of size 2" if event == "failed" else "",
    )


def _json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


# Clean checks of every kernel of the target but W1: standing in for the H100 run.
STAND_IN = [
    _json(_check(event, 1000 + i, m=m).as_json())
    for i, m in enumerate(_OTHERS)
    for event in ("started", "clean")
]
W1_CLEAN = [_json(_check(e, 999).as_json()) for e in ("started", "clean")]


def _db(tmp_path: Path, lines: list[str], torn: str = "") -> Path:
    """A database of ``lines`` (each followed by a newline) and, last, a torn line."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "db.jsonl"
    path.write_bytes("".join(line + "\n" for line in lines).encode() + torn.encode())
    return path


def _build(path: Path, monkeypatch) -> tuple[str, str, list[str]]:
    """The CPU build of the one-target manifest from ``path``: what it selects for the
    target (``W1``, ``W2``, another design key, ``cublaslt`` or ``fallback``), its log,
    and the warnings it gave."""
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    manifest = dataclasses.replace(load_manifest(MANIFEST), targets=[TARGET])
    log = io.StringIO()
    cache = ArtifactCache(path.parent / "cache")
    b = Build(manifest, path, cache, path.parent / "out", log=log)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (sel,), missing = b.measure_and_select()
    assert missing == []
    if sel.kind != "kernel":
        chosen = sel.kind
    else:
        named = {W1.design_key: "W1", W2.design_key: "W2"}
        chosen = named.get(sel.winner.design_key, sel.winner.design_key)
    return chosen, log.getvalue(), [str(w.message) for w in caught]


# -- 1. a damaged record: skipped with one warning naming file and line, and counted ----
def _edit(**changes):
    """W1's record with keys replaced (dotted paths reach into objects)."""

    def edit(d):
        for path, value in changes.items():
            *parents, key = path.split(".")
            node = d
            for p in parents:
                node = node[p]
            node[key] = value
        return _json(d)

    return edit


def _drop(path):
    def edit(d):
        *parents, key = path.split(".")
        node = d
        for p in parents:
            node = node[p]
        del node[key]
        return _json(d)

    return edit


def _text(fn):
    """A line made from W1's committed text."""
    return lambda d: fn(W1_LINE)


def _scaled(factor):
    """Every timing of W1 (samples and medians, baselines too) scaled consistently."""

    def edit(d):
        d["samples_us"] = [x * factor for x in d["samples_us"]]
        d["median_us"] *= factor
        return _json(d)

    return edit


_MEDIAN = re.compile(r'"median_us":[0-9.e]+')

# (id, W1's line as made from its record, the reason it is skipped: exact text; None:
# spelled by ``_reason_of``)
LINE_FAULTS = [
    ("torn-json", _text(lambda s: s[: len(s) // 2]),
     "not JSON (Expecting ',' delimiter: line 1 column 1277 (char 1276))"),
    ("not-an-object", _text(lambda s: "[" + s + "]"), None),
    ("a-bare-number", _text(lambda s: "35.25"), "a record must be a JSON object, got 35.25"),
    ("missing-target", _drop("target"), "key 'target' is missing"),
    ("missing-samples", _drop("samples_us"), "key 'samples_us' is missing"),
    ("missing-status", _drop("status"), "key 'status' is missing"),
    ("string-median", _edit(median_us="14.5067"),
     "key 'median_us': must be a positive finite number, got '14.5067'"),
    ("string-sample", _edit(**{"samples_us": ["14.5"] * 30}),
     "key 'samples_us[0]': must be a positive finite number, got '14.5'"),
    ("nested-sample-lists", _edit(samples_us=[[14.5]] * 30),
     "key 'samples_us[0]': must be a positive finite number, got [14.5]"),
    ("samples-null", _edit(samples_us=None),
     "key 'samples_us': must be a list of timing samples, got None"),
    ("samples-empty", _edit(samples_us=[]),
     "key 'samples_us': must hold the samples median_us is the median of, got []"),
    ("negative-sample", _edit(**{"samples_us": [-14.5] * 30}),
     "key 'samples_us[0]': must be a positive finite number, got -14.5"),
    ("zero-median", _edit(median_us=0),
     "key 'median_us': must be a positive finite number, got 0"),
    ("nan-sample", _text(lambda s: s.replace('"samples_us":[', '"samples_us":[NaN,', 1)),
     "NaN is not a number any record holds"),
    ("infinite-median", _text(lambda s: _MEDIAN.sub('"median_us":Infinity', s)),
     "key 'median_us': must be a positive finite number, got inf"),
    ("huge-exponent-median", _text(lambda s: _MEDIAN.sub('"median_us":1e999', s)),
     "key 'median_us': must be a positive finite number, got inf"),
    ("target-a-list", _edit(target=[1, 4096, 4096]),
     "key 'target': must be an object, got [1, 4096, 4096]"),
    ("target-m-string", _edit(**{"target.m": "1"}),
     "key 'target.m': must be a positive integer up to 2147483647, got '1'"),
    ("target-m-bool", _edit(**{"target.m": True}),
     "key 'target.m': must be a positive integer up to 2147483647, got True"),
    ("target-m-zero", _edit(**{"target.m": 0}),
     "key 'target.m': must be a positive integer up to 2147483647, got 0"),
    ("target-m-4300-digits", _text(lambda s: s.replace('"m":1,', '"m":' + "9" * 5000 + ",", 1)),
     None),
    ("target-dtype-unknown", _edit(**{"target.dtype": "fp8"}),
     "key 'target.dtype': must be one of fp16, bf16, got 'fp8'"),
    ("design-a-list", _edit(design=["sm90stream"]),
     "key 'design': must be an object, got ['sm90stream']"),
    ("knob-a-float", _edit(**{"design.knobs.stages": 3.0}),
     "key 'design.knobs.stages': must be an integer, got 3.0"),
    ("knob-a-string", _edit(**{"design.knobs.stages": "3"}),
     "key 'design.knobs.stages': must be an integer, got '3'"),
    ("knob-a-dict", _edit(**{"design.knobs.stages": {"v": 3}}),
     "key 'design.knobs.stages': must be an integer, got {'v': 3}"),
    ("design-for-another-dtype", _edit(**{"design.dtype": "bf16"}), None),
    ("design-key-not-the-designs", _edit(design_key="0" * 64), None),
    ("gpu-a-string", _edit(gpu="NVIDIA H100 80GB HBM3"),
     "key 'gpu': must be an object, got 'NVIDIA H100 80GB HBM3'"),
    ("gpu-sm-count-string", _edit(**{"gpu.sm_count": "132"}),
     "key 'gpu.sm_count': must be a positive integer, got '132'"),
    ("gpu-clocks-nested-list", _edit(**{"gpu.clocks_mhz": [[1980]]}),
     "key 'gpu.clocks_mhz': must be an object, got [[1980]]"),
    ("gpu-index-negative", _edit(**{"gpu.index": -1}),
     "key 'gpu.index': must be a non-negative integer, got -1"),
    ("gpu-index-string", _edit(**{"gpu.index": "0"}),
     "key 'gpu.index': must be a non-negative integer, got '0'"),
    ("gpu-index-bool", _edit(**{"gpu.index": True}),
     "key 'gpu.index': must be a non-negative integer, got True"),
    ("gpu-host-a-number", _edit(**{"gpu.host": 7}),
     "key 'gpu.host': must be a string, got 7"),
    ("gpu-unknown-key", _edit(**{"gpu.uuid": "GPU-1"}),
     "key 'gpu.uuid' is not in the schema"),
    ("baselines-a-list", _edit(baselines_us=[16.44]),
     "key 'baselines_us': must be an object, got [16.44]"),
    ("baseline-a-string", _edit(**{"baselines_us.torch": "16.44"}),
     "key 'baselines_us.torch': must be a positive finite number, got '16.44'"),
    ("baseline-not-its-samples-median", _edit(**{"baselines_us.torch": 1644.0}), None),
    ("no-torch-baseline", _edit(baselines_us={}, baseline_samples_us={}),
     "key 'baselines_us.torch' is missing (status ok: timed beside torch)"),
    ("metric-a-string", _edit(**{"metrics.tflops": "2.3"}),
     "key 'metrics.tflops': must be a number, got '2.3'"),
    ("metric-a-dict", _edit(**{"metrics.tflops": {"v": 2.3}}),
     "key 'metrics.tflops': must be a number, got {'v': 2.3}"),
    ("vendor-a-list", _edit(vendor=["cublaslt"]),
     "key 'vendor': must be an object, got ['cublaslt']"),
    ("status-unknown", _edit(status="great"),
     "key 'status': must be one of ok, compile, runtime, incorrect, timeout, illegal, "
     "sanitizer, got 'great'"),
    ("schema-version-3", _edit(schema_version=3),
     "unknown schema_version 3 (this cudal2 reads 2)"),
    ("schema-version-1", _edit(schema_version=1),
     "schema 1 (written before families owned their knobs): migrate the file with "
     "`python -m cudal2.migrate FILE`"),
    ("measured-at-not-a-time", _edit(measured_at="yesterday"),
     "key 'measured_at': must be a UTC time as 2026-11-21T17:22:40Z, got 'yesterday'"),
    ("unknown-key", _edit(speedup=1668.0), "key 'speedup' is not in the schema"),
    ("key-given-twice", _text(lambda s: s[:-1] + ',"median_us":0.01}'),
     "key 'median_us' is given twice in one object"),
    ("spread-missing-for-ok", _edit(spread=None),
     "key 'spread': must be a number in a record of status ok, got None"),
    ("median-not-its-samples", _edit(median_us=0.01), None),
    ("sub-floor-timings", _scaled(1e-3), None),
    ("invalid-utf8", _text(lambda s: s.replace('"proposer":"grid"', '"proposer":"gr\udcffid"')),
     None),
    ("nul-bytes", _text(lambda s: s.replace('"error":""', '"error":"\x00\x00"')),
     "NUL bytes: not a record"),
    ("binary-garbage", _text(lambda s: "\udc89PNG\r\x1a\x00\x00\x00\rIHDR\udcff\udcfe"),
     "not UTF-8: byte 0x89 at column 1"),
    ("deeply-nested", _text(lambda s: "[" * 100_000 + "]" * 100_000),
     "not JSON: nested deeper than any record"),
    ("huge-line", _text(lambda s: s[:-1] + ',"pad":"' + "x" * MAX_LINE_BYTES + '"}'),
     f"line longer than {MAX_LINE_BYTES} bytes"),
    ("utf8-bom", _text(lambda s: "\ufeff" + s), None),
    ("record-kind-unknown", _edit(record="tuning"),
     "key 'record': must be 'sanitizer_check' (or absent: a measurement), got 'tuning'"),
]  # fmt: skip


def _reason_of(case_id: str) -> str:
    """Reasons too long or too data-bound to spell in the table, from the record."""
    med = sorted(W1.samples_us)[len(W1.samples_us) // 2 - 1 : len(W1.samples_us) // 2 + 1]
    # fp16 1x4096x4096 on the H100: (4096*4096 + 2*4096) * 2 bytes at 3.35 TB/s
    floor = "10.02"
    column = W1_LINE.index('"proposer":"gr') + len('"proposer":"gr') + 1
    return {
        "not-an-object": "a record must be a JSON object, got "
        f"{repr([json.loads(W1_LINE)])[:57]}...",
        "target-m-4300-digits": "not JSON (Exceeds the limit (4300 digits) for integer string "
        "conversion: value has 5000 digits; use sys.set_int_max_str_digits() to increase the "
        "limit)",
        "design-for-another-dtype": "key 'design.dtype': must be the target's (fp16), got 'bf16'",
        "design-key-not-the-designs": "key 'design_key': must be the sha256 of the design's "
        f"canonical JSON, got {repr('0' * 64)[:57]}...",
        "invalid-utf8": f"not UTF-8: byte 0xff at column {column}",
        "baseline-not-its-samples-median": "baselines_us.torch 1644 is not the median of its 30 "
        f"samples ({W1.baselines_us['torch']:.6g})",
        "median-not-its-samples": f"median_us 0.01 is not the median of its 30 samples "
        f"({(med[0] + med[1]) / 2:.6g})",
        "sub-floor-timings": f"median_us {W1.median_us * 1e-3:.4g} us is below the physical "
        f"floor of fp16/tn 1x4096x4096 on NVIDIA H100 80GB HBM3 ({floor} us): a measurement "
        "error",
        "utf8-bom": "not JSON (Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 "
        "(char 0))",
    }[case_id]


def _encode(line: str) -> bytes:
    return line.encode("utf-8", "surrogateescape")  # \udcXX: a raw byte XX


@needs_nvcc
@pytest.mark.parametrize("case_id, make, reason", LINE_FAULTS, ids=[c[0] for c in LINE_FAULTS])
def test_a_damaged_record_is_skipped_named_and_counted(
    tmp_path, monkeypatch, case_id, make, reason
):
    reason = reason or _reason_of(case_id)
    bad = make(json.loads(W1_LINE))
    lines = [W1_LINE if m is W1 else line for line, m in ROWS]
    at = lines.index(W1_LINE)
    body = [_encode(line) for line in [*lines, *STAND_IN, *W1_CLEAN]]
    body[at] = _encode(bad)
    path = tmp_path / "db.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in body))
    contents = MeasurementDB(path).load(warn=False)
    assert contents.skipped == (Skipped(at + 1, reason),)
    assert [m for m in contents.measurements] == [m for _, m in ROWS if m is not W1]
    chosen, log, warned = _build(path, monkeypatch)
    assert chosen == "W2"  # W1's record is gone: its understudy ships
    assert f"1 unreadable records skipped in {path}" in log
    assert warned == [f"{path}:{at + 1}: skipping unreadable record ({reason})"]


@needs_nvcc
def test_the_undamaged_database_ships_w1(tmp_path, monkeypatch):
    """The control of every case: the same database without a fault."""
    path = _db(tmp_path, [*(line for line, _ in ROWS), *STAND_IN, *W1_CLEAN])
    assert _build(path, monkeypatch)[0] == "W1"
    assert MeasurementDB(path).load().skipped == ()


# -- 2. whole-file faults -----------------------------------------------------------------
def _rows() -> list[str]:
    return [line for line, _ in ROWS]


# (id, the file's lines, a torn last line, what is selected, skipped lines (line, reason))
FILE_FAULTS = [
    ("torn-last-line-is-w1", [*[r for r in _rows() if r != W1_LINE], *STAND_IN, *W1_CLEAN],
     W1_LINE[:700], "W2", [(len(ROWS) + len(STAND_IN) + 2,
     "not JSON (Expecting ',' delimiter: line 1 column 700 (char 699))")]),
    ("blank-lines-between", [x for r in _rows() for x in (r, "", "   ")] + STAND_IN + W1_CLEAN,
     "", "W1", []),
    ("crlf-line-ends", [r + "\r" for r in _rows()] + STAND_IN + W1_CLEAN, "", "W1", []),
    ("w1-twice", [*_rows(), W1_LINE, *STAND_IN, *W1_CLEAN], "", "W1", []),
    ("file-concatenated-twice", [*_rows(), *STAND_IN, *W1_CLEAN] * 2, "", "W1", []),
]  # fmt: skip


@needs_nvcc
@pytest.mark.parametrize(
    "case_id, lines, torn, chosen, skipped",
    FILE_FAULTS,
    ids=[c[0] for c in FILE_FAULTS],
)
def test_a_whole_file_fault(tmp_path, monkeypatch, case_id, lines, torn, chosen, skipped):
    path = _db(tmp_path, lines, torn)
    got = MeasurementDB(path).load(warn=False).skipped
    assert got == tuple(Skipped(line, reason) for line, reason in skipped)
    assert _build(path, monkeypatch)[0] == chosen


@needs_nvcc
def test_an_append_after_a_torn_line_starts_a_fresh_line(tmp_path, monkeypatch):
    """A writer killed mid-line leaves no newline; the next append must not glue its
    record to the fragment (that would lose a whole record, the clean check here)."""
    path = _db(tmp_path, [*_rows(), *STAND_IN, W1_CLEAN[0]], torn=W1_CLEAN[1][:40])
    MeasurementDB(path).append_checks([_check("clean", 999)])
    contents = MeasurementDB(path).load(warn=False)
    assert [s.line for s in contents.skipped] == [len(ROWS) + len(STAND_IN) + 2]
    assert contents.checks[-1] == _check("clean", 999)
    assert _build(path, monkeypatch)[0] == "W1"


@needs_nvcc
def test_many_bad_lines_are_each_counted_and_warned_about_at_most_20_times(tmp_path, monkeypatch):
    garbage = [f"\udc89\udcfe garbage {i}" for i in range(1000)]
    path = tmp_path / "db.jsonl"
    body = [*_rows(), *garbage, *STAND_IN, *W1_CLEAN]
    path.write_bytes(b"".join(_encode(x) + b"\n" for x in body))
    chosen, log, warned = _build(path, monkeypatch)
    assert chosen == "W1" and "1000 unreadable records skipped in" in log
    assert len(warned) == MAX_WARNINGS + 1
    assert warned[-1] == f"{path}: {1000 - MAX_WARNINGS} more unreadable records skipped"


@needs_nvcc
def test_a_gpu_model_without_a_datasheet_is_read_but_not_selected_from(tmp_path, monkeypatch):
    """Its times cannot be checked against a physical floor: kept (the policy learns
    from them; merges keep them), never shipped, and the log says why."""
    b200 = [
        _json({**json.loads(r), "gpu": {**json.loads(r)["gpu"], "name": "NVIDIA B200"}})
        for r in _rows()
    ]
    path = _db(tmp_path, [*_rows(), *b200, *STAND_IN, *W1_CLEAN])
    contents = MeasurementDB(path).load()
    assert len(contents.measurements) == 2 * len(ROWS) and contents.skipped == ()
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    manifest = dataclasses.replace(load_manifest(MANIFEST), targets=[TARGET])
    log = io.StringIO()
    b = Build(manifest, path, ArtifactCache(tmp_path / "c"), tmp_path, log=log)
    sels, _ = b.measure_and_select()
    assert [(s.gpu, s.winner.design_key) for s in sels] == [(W1.gpu.name, W1.design_key)]
    assert "no datasheet for NVIDIA B200 in cudal2/hardware.py" in log.getvalue()


def test_the_issues_1668x_record_is_never_selected(tmp_path, monkeypatch):
    """Issue 17: a record whose median is 0.01 us while its samples are ~14.6 us was
    selected and shipped at 1668x. Built from the committed record it was: the
    cuBLASLt algorithm of fp16/tn 16x4096x4096, torch at 16.68 us."""
    (line,) = [
        ln for ln, m in zip(LINES, RECORDS, strict=True) if m.target == OTHER and m.is_vendor
    ]
    record = json.loads(line)
    assert round(record["baselines_us"]["torch"] / 0.01) == 1668
    lying = _json({**record, "median_us": 0.01})
    # Believed, it wins at 1668x over torch.
    from cudal2.schema import parse_line

    believed = parse_line(lying)
    others = [m for m in RECORDS if m.target == OTHER and not m.is_vendor]
    (sel,), _ = select([OTHER], [*others, believed], "offline")
    assert sel.kind == "cublaslt" and round(sel.speedup) == 1668
    # Read from a database, it is skipped: the target selects what it did without it.
    path = _db(tmp_path, [lying if ln == line else ln for ln in LINES])
    contents = MeasurementDB(path).load(warn=False)
    (skip,) = contents.skipped
    assert skip.line == LINES.index(line) + 1
    assert skip.reason == (
        f"median_us 0.01 is not the median of its 30 samples ({record['median_us']:.6g})"
    )
    without = [m for m in RECORDS if m.target == OTHER and not m.is_vendor]
    (want,), _ = select([OTHER], without, "offline")
    (got,), _ = select([OTHER], [m for m in contents.measurements if m.target == OTHER], "offline")
    assert (got.kind, got.time_us) == (want.kind, want.time_us) and got.speedup < 1.2


# -- 3. the sanitizer gate: lost, torn and reordered check lines ---------------------------
def _line(token: str) -> tuple[str, str]:
    """A check line from a token: ``S1`` / ``C1`` / ``X1`` (started / clean / failed,
    check 1, W1 at the target), ``L`` (a failure recorded as a measurement, before
    checks had lines), with suffixes ``:other`` (W1's artifact at another target),
    ``:gpu`` (another GPU model), ``:tc`` (another toolchain), ``@later`` (written an
    hour later by the clock: a merged file). Prefix ``-``: the line is lost (not
    written), ``~``: torn (written last, cut short)."""
    mode = token[0] if token[0] in "-~" else ""
    token = token.lstrip("-~")
    name, *suffixes = re.split(r"[:@]", token)
    kw: dict = {}
    for s in suffixes:
        kw.update(
            {"other": {"target": OTHER}, "gpu": {"gpu": "NVIDIA H200"},
             "tc": {"toolchain": "nvcc 99; timing v9"}, "later": {"at": LATER}}[s]
        )  # fmt: skip
    if name == "L":
        failed = dataclasses.replace(
            W1,
            status=Status.SANITIZER,
            error="memcheck exited 86:\nInvalid __global__ write of size 2",
            samples_us=(),
            median_us=None,
            measured_at=kw.get("at", AT),
        )
        return mode, _json(failed.as_json())
    event = {"S": "started", "C": "clean", "X": "failed"}[name[0]]
    return mode, _json(_check(event, int(name[1:]), **kw).as_json())


def _gate_db(tmp_path: Path, tokens: str) -> Path:
    lines, torn = [*_rows(), *STAND_IN], ""
    for token in tokens.split():
        mode, line = _line(token)
        if mode == "~":
            torn = line[: len(line) // 2]
        elif mode != "-":
            lines.append(line)
    return _db(tmp_path, lines, torn)


# (id, W1's check lines in file order, the state of W1's key, what the target ships)
GATE_CASES = [
    ("never-checked", "", Gate.UNCHECKED, "W2"),
    ("clean", "S1 C1", Gate.CLEAN, "W1"),
    ("failed", "S1 X1", Gate.FAILED, "W2"),
    ("crashed-during-the-check", "S1", Gate.PENDING, "W2"),
    ("a-failure-after-a-clean-run", "S1 C1 S2 X2", Gate.FAILED, "W2"),
    ("a-clean-run-after-a-failure", "S1 X1 S2 C2", Gate.CLEAN, "W1"),
    ("the-recheck-crashed", "S1 C1 S2", Gate.PENDING, "W2"),
    ("torn-failure-verdict", "S1 ~X1", Gate.PENDING, "W2"),
    ("torn-clean-verdict", "S1 ~C1", Gate.PENDING, "W2"),
    ("torn-started-line", "~S1", Gate.UNCHECKED, "W2"),
    ("lost-started-line-of-a-failure", "-S1 X1", Gate.FAILED, "W2"),
    ("lost-failure-verdict", "S1 -X1", Gate.PENDING, "W2"),
    ("lost-started-line-of-a-clean-check", "-S1 C1", Gate.UNCHECKED, "W2"),
    ("lost-start-of-the-recheck", "S1 X1 -S2 C2", Gate.FAILED, "W2"),
    ("lost-failure-after-a-clean-run", "S1 C1 S2 -X2", Gate.PENDING, "W2"),
    ("legacy-failure-record", "L", Gate.FAILED, "W2"),
    ("clean-run-after-a-legacy-failure", "L S1 C1", Gate.CLEAN, "W1"),
    ("legacy-failure-after-a-clean-run", "S1 C1 L", Gate.FAILED, "W2"),
    ("failed-at-another-target", "S1 C1 S2:other X2:other", Gate.CLEAN, "W2"),
    ("unfinished-at-another-target", "S1 C1 S2:other", Gate.CLEAN, "W2"),
    ("clean-at-another-target-too", "S1 C1 S2:other C2:other", Gate.CLEAN, "W1"),
    ("clean-on-another-gpu-model", "S1:gpu C1:gpu", Gate.UNCHECKED, "W2"),
    ("failed-on-another-gpu-model", "S1 C1 S2:gpu X2:gpu", Gate.CLEAN, "W2"),
    ("clean-with-another-toolchain", "S1:tc C1:tc", Gate.UNCHECKED, "W2"),
    ("verdict-of-another-check", "S1 C2", Gate.PENDING, "W2"),
    ("verdict-before-its-start", "C1 S1", Gate.PENDING, "W2"),
    ("merged-failure-later-by-the-clock", "S2@later X2@later S1 C1", Gate.FAILED, "W2"),
    ("merged-unfinished-check-later-by-the-clock", "S2@later S1 C1", Gate.PENDING, "W2"),
    ("overlapping-checks-one-failed", "S1 S2 C2 X1", Gate.FAILED, "W2"),
    ("duplicated-check-lines", "S1 C1 S1 C1", Gate.CLEAN, "W1"),
    ("duplicated-start-verdict-lost", "S1 C1 S1", Gate.PENDING, "W2"),
]


@needs_nvcc
@pytest.mark.parametrize(
    "case_id, tokens, state, chosen", GATE_CASES, ids=[c[0] for c in GATE_CASES]
)
def test_the_sanitizer_gate(tmp_path, monkeypatch, case_id, tokens, state, chosen):
    path = _gate_db(tmp_path, tokens)
    key = CheckKey(W1.gpu.name, W1.toolchain, W1.artifact_key, TARGET.key)
    assert SanitizerLedger(MeasurementDB(path).load(warn=False).checks).state(key) == state
    got, log, _ = _build(path, monkeypatch)
    assert got == chosen
    waits = "1 selected kernels wait for a sanitizer run on a GPU (NVIDIA H100 80GB HBM3)"
    # W1 waits unless a failure vetoes it (then it is not a would-be winner) or it ships.
    vetoed = SanitizerLedger(MeasurementDB(path).load(warn=False).checks).vetoed(W1.artifact_key)
    assert (waits in log) == (chosen == "W2" and not vetoed)


# Histories in which W1 was rejected (its failure stands): no single lost line, nor a
# torn last line, may let it ship. Each line of each is lost in turn.
REJECTED = ["S1 X1", "S1 C1 S2 X2", "S1 X1 S2 C2 S3 X3", "L S1 C1 S2 X2", "S1 C1 S2:other X2:other"]
LOSSES = [
    (history, " ".join(("-" if i == j else "") + t for j, t in enumerate(history.split())))
    for history in REJECTED
    for i in range(len(history.split()))
] + [
    (history, " ".join([*history.split()[:-1], "~" + history.split()[-1]])) for history in REJECTED
]


@needs_nvcc
@pytest.mark.parametrize("history, damaged", LOSSES, ids=[d for _, d in LOSSES])
def test_no_lost_or_torn_line_ships_a_rejected_kernel(tmp_path, monkeypatch, history, damaged):
    whole = _gate_db(tmp_path / "whole", history)
    assert _build(whole, monkeypatch)[0] == "W2"
    ledger = SanitizerLedger(MeasurementDB(_gate_db(tmp_path, damaged)).load(warn=False).checks)
    key = CheckKey(W1.gpu.name, W1.toolchain, W1.artifact_key, TARGET.key)
    assert not ledger.clear(key)
    assert _build(_gate_db(tmp_path / "b", damaged), monkeypatch)[0] == "W2"


# -- 4. --measurements that is not a database: exit 2, fast, nothing read ----------------
@contextmanager
def _deadline(seconds: int):
    """A read that would block (a FIFO) or never end (/dev/zero) fails the case."""

    def expire(*_):
        raise TimeoutError(f"cudal2-build did not return within {seconds} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _fifo(tmp: Path) -> Path:
    os.mkfifo(tmp / "db.jsonl")
    return tmp / "db.jsonl"


def _socket(tmp: Path) -> Path:
    path = tmp / "db.jsonl"
    if len(str(path)) > 100:  # a socket's path must fit sockaddr_un (108 bytes)
        import tempfile

        path = Path(tempfile.mkdtemp(prefix="cudal2-")) / "db.jsonl"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


def _unreadable(tmp: Path) -> Path:
    path = tmp / "db.jsonl"
    path.write_text(W1_LINE + "\n")
    path.chmod(0)
    return path


def _zlink(tmp: Path) -> Path:
    (tmp / "db.jsonl").symlink_to("/dev/zero")
    return tmp / "db.jsonl"


def _not_gzip(tmp: Path) -> Path:
    (tmp / "db.jsonl.gz").write_text(W1_LINE + "\n")
    return tmp / "db.jsonl.gz"


def _under_a_file(tmp: Path) -> Path:
    (tmp / "file").write_text("")
    return tmp / "file" / "db.jsonl"


# (id, the --measurements path, exit code, the error's text after "cudal2-build: error: ")
PATH_FAULTS = [
    ("a-directory", lambda t: t, 2, "{p} is a directory, not a measurement database (a regular "
     ".jsonl or .jsonl.gz file)"),
    ("a-fifo", _fifo, 2, "{p} is a named pipe (FIFO), not a measurement database (a regular "
     ".jsonl or .jsonl.gz file)"),
    ("dev-zero", lambda t: Path("/dev/zero"), 2, "/dev/zero is a character device, not a "
     "measurement database (a regular .jsonl or .jsonl.gz file)"),
    ("a-link-to-dev-zero", _zlink, 2, "{p} is a character device, not a measurement database "
     "(a regular .jsonl or .jsonl.gz file)"),
    ("a-socket", _socket, 2, "{p} is a socket, not a measurement database (a regular .jsonl or "
     ".jsonl.gz file)"),
    ("unreadable", _unreadable, 2, "{p}: cannot open: Permission denied"),
    ("a-path-under-a-file", _under_a_file, 2, "argument --measurements: '{p}': its folder "
     "'{p.parent}' is not a folder (see cudal2-build --help)"),
    ("gz-that-is-not-gzip", _not_gzip, 2, "{p}: not a gzip file (Not a gzipped file (b'{{\"'))"),
    ("missing", lambda t: t / "new.jsonl", 3, "no GPU here and no recorded measurements for "
     "this manifest's targets in {p}: run cudal2-build on a machine with an NVIDIA GPU, or pass "
     "--measurements FILE recorded on one, or split the build (docs/ci.md)"),
]  # fmt: skip


@pytest.mark.parametrize(
    "case_id, make, code, message", PATH_FAULTS, ids=[c[0] for c in PATH_FAULTS]
)
def test_measurements_that_is_no_database(
    tmp_path, monkeypatch, capsys, case_id, make, code, message
):
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    if case_id == "unreadable" and os.geteuid() == 0:  # root reads anything: deny as the OS would
        real = os.open

        def denied(path, flags, *a):
            if str(path).endswith("db.jsonl"):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, flags, *a)

        monkeypatch.setattr("cudal2.database.os.open", denied)
    path = make(tmp_path)
    out = tmp_path / "dist"
    with _deadline(20):
        rc = build_cli.main([str(MANIFEST), "--measurements", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert (rc, err.strip()) == (code, "cudal2-build: error: " + message.format(p=path))
    assert not out.exists()  # nothing written


def test_a_truncated_gzip_database_keeps_what_it_can_read(tmp_path, monkeypatch):
    data = gzip.compress("".join(x + "\n" for x in [*_rows(), *STAND_IN, *W1_CLEAN]).encode())
    path = tmp_path / "db.jsonl.gz"
    path.write_bytes(data[: len(data) * 3 // 4])
    contents = MeasurementDB(path).load(warn=False)
    (skip,) = contents.skipped
    assert skip.reason.startswith("the rest of the file is unreadable: Compressed file ended")
    assert 0 < len(contents.measurements) + len(contents.checks) < len(ROWS) + len(STAND_IN) + 2


@pytest.mark.parametrize("kind", ["gz", "fifo", "directory"])
def test_appending_to_what_is_no_plain_database_is_refused(tmp_path, kind):
    path = {"gz": tmp_path / "db.jsonl.gz", "fifo": tmp_path / "db.jsonl", "directory": tmp_path}
    path = path[kind]
    if kind == "fifo":
        os.mkfifo(path)
    with _deadline(10), pytest.raises(DatabaseError) as e:
        MeasurementDB(path).append_checks([_check("clean", 1)])
    assert (
        str(e.value)
        == {
            "gz": f"{path}: a gzipped database is read-only; measure into a plain .jsonl file "
            "(gunzip a copy to extend this one)",
            "fifo": f"{path} is a named pipe (FIFO), not a measurement database (a regular .jsonl "
            "or .jsonl.gz file)",
            "directory": f"{path} is a directory, not a measurement database (a regular .jsonl or "
            ".jsonl.gz file)",
        }[kind]
    )
    if kind == "fifo":
        assert stat.S_ISFIFO(os.stat(path).st_mode)


# -- 5. a build on a GPU: checks announced, recorded, crashed, re-run ----------------------
class Memcheck(ReplayRunner):
    """The replay of the case's database standing in for the GPU: compute-sanitizer
    answers per artifact ``clean`` (default), ``failed``, ``none`` (no answer) or
    ``crash`` (the build dies while memcheck runs)."""

    def __init__(self, path: Path, verdicts: dict[str, str]):
        contents = MeasurementDB(path).load(warn=False)
        super().__init__(contents.measurements, checks=contents.checks)
        self.verdicts = verdicts
        self.asked: list[tuple[str, str]] = []

    def answer(self, job):
        if job.kind != JobKind.SANITIZE:
            return super().answer(job)
        who = "W1" if job.artifact_key == W1.artifact_key else job.artifact_key
        self.asked.append((who, "other" if job.target == OTHER else "target"))
        verdict = self.verdicts.get(job.artifact_key, "clean")
        if verdict == "crash":
            raise KeyboardInterrupt("the build is killed while memcheck runs")
        if verdict == "none":
            return JobResult.not_recorded(job, "no answer")
        return JobResult(job, Status.OK if verdict == "clean" else Status.SANITIZER, verdict)


def _gpu_build(path: Path, monkeypatch, verdicts: dict[str, str], remeasure: bool = False):
    monkeypatch.setattr("cudal2.pipeline.build.gpu_names", lambda: [])
    manifest = dataclasses.replace(load_manifest(MANIFEST), targets=[TARGET])
    runner = Memcheck(path, verdicts)
    log = io.StringIO()
    b = Build(manifest, path, ArtifactCache(path.parent / "c"), path.parent, runner=runner,
              log=log, remeasure=remeasure)  # fmt: skip
    (sel,), _ = b.measure_and_select()
    chosen = (
        "W1"
        if sel.winner and sel.winner.design_key == W1.design_key
        else ("W2" if sel.winner and sel.winner.design_key == W2.design_key else sel.kind)
    )
    return chosen, runner.asked, log.getvalue()


def _events(path: Path) -> str:
    """W1's check lines in the database, as tokens (S started, C clean, X failed)."""
    names = {"started": "S", "clean": "C", "failed": "X"}
    return " ".join(
        names[c.event] + (":other" if c.target == OTHER else "")
        for c in MeasurementDB(path).load(warn=False).checks
        if c.artifact_key == W1.artifact_key
    )


# (id, W1's check lines before, memcheck's answer for W1, what the GPU build ships,
#  W1's check lines after, what a CPU build then ships, and a GPU build whose memcheck
#  passes)
LIVE_CASES = [
    ("checked-clean", "", "clean", "W1", "S C", "W1", "W1"),
    ("checked-failed", "", "failed", "W2", "S X", "W2", "W2"),
    ("no-answer-stays-pending", "", "none", "W2", "S", "W2", "W1"),
    ("killed-during-memcheck", "", "crash", None, "S", "W2", "W1"),
    ("pending-verdict-lost-before", "S1 -X1", "clean", "W1", "S S C", "W1", "W1"),
    # only the unfinished check runs again
    ("pending-at-another-target-rechecked", "S1 C1 S2:other", "clean", "W1",
     "S C S:other S:other C:other", "W1", "W1"),
    ("a-failure-is-not-rechecked", "S1 X1", "clean", "W2", "S X", "W2", "W2"),
]  # fmt: skip


@needs_nvcc
@pytest.mark.parametrize(
    "case_id, before, verdict, first, after, cpu, second",
    LIVE_CASES,
    ids=[c[0] for c in LIVE_CASES],
)
def test_a_gpu_build_checks_announces_and_recovers(
    tmp_path, monkeypatch, case_id, before, verdict, first, after, cpu, second
):
    path = _gate_db(tmp_path, before)
    verdicts = {W1.artifact_key: verdict}
    if first is None:
        with pytest.raises(KeyboardInterrupt):
            _gpu_build(path, monkeypatch, verdicts)
    else:
        chosen, asked, log = _gpu_build(path, monkeypatch, verdicts)
        assert chosen == first
        assert ("1 selected kernels failed compute-sanitizer: reselecting" in log) == (
            verdict == "failed"
        )
    assert _events(path) == after
    assert _build(path, monkeypatch)[0] == cpu
    assert _gpu_build(path, monkeypatch, {})[0] == second


def test_two_builds_never_check_one_database_at_once(tmp_path):
    """The check lock: a second holder waits for the first (so a verdict always lands
    before a later check of the same database starts)."""
    import threading
    import time

    db = MeasurementDB(tmp_path / "db.jsonl")
    seen: list[str] = []

    def check(name: str) -> None:
        with db.locked():
            seen.append(f"{name} starts")
            time.sleep(0.2)
            seen.append(f"{name} ends")

    threads = [threading.Thread(target=check, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen in (
        ["a starts", "a ends", "b starts", "b ends"],
        ["b starts", "b ends", "a starts", "a ends"],
    )


@needs_nvcc
def test_remeasure_rechecks_a_failed_kernel_and_a_clean_check_lifts_the_veto(tmp_path, monkeypatch):
    """``--remeasure`` checks every would-be winner again, a vetoed one too: a full clean
    check recorded after the failure lets it ship."""
    path = _gate_db(tmp_path, "S1 X1")
    chosen, asked, _ = _gpu_build(path, monkeypatch, {}, remeasure=True)
    assert (chosen, asked) == ("W1", [("W1", "target")])
    assert _events(path) == "S X S C"
