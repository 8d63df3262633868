"""Bad command lines of every CLI (issue 17): exit status 2, one line on stderr naming
the argument, no traceback, nothing written (the tests run in an empty folder, which
must stay as the case left it).

Each case is one line of ``CASES``: an id, the CLI, its arguments (``{tmp}`` is the
test's folder, holding ``file`` (a regular file) and ``dir/`` (a folder)), and what
the message must say.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from cudal2.cli import bench, build, diff, policy
from cudal2.manifest import default_manifest_path

MAINS: dict[str, Callable[[list[str]], int]] = {
    "cudal2-build": build.main,
    "cudal2-diff": diff.main,
    "cudal2-bench": bench.main,
    "cudal2-policy": policy.main,
}
DB = str(default_manifest_path().with_name("default.measurements.jsonl"))


class Case(NamedTuple):
    id: str
    cli: str
    argv: str  # split on spaces after {tmp} and {db} are filled in
    says: str


# fmt: off
CASES: list[Case] = [
    # cudal2-build
    Case("build-jobs-negative", "cudal2-build", "--jobs -1", "argument --jobs: must be a positive"),
    Case("build-jobs-0", "cudal2-build", "--jobs 0", "argument --jobs: must be a positive"),
    Case("build-jobs-word", "cudal2-build", "--jobs many", "argument --jobs: not an integer"),
    Case("build-jobs-float", "cudal2-build", "--jobs 1.5", "argument --jobs: not an integer"),
    Case("build-device-negative", "cudal2-build", "--device -1", "argument --device: must be"),
    Case("build-device-word", "cudal2-build", "--device gpu0", "argument --device: not an int"),
    Case("build-out-a-file", "cudal2-build", "--out {tmp}/file",
         "argument --out: '{tmp}/file' exists and is not a folder"),
    Case("build-out-under-a-file", "cudal2-build", "--out {tmp}/file/dist",
         "argument --out: folder '{tmp}/file/dist' cannot be made: {tmp}/file is not a folder"),
    Case("build-cache-a-file", "cudal2-build", "--cache {tmp}/file",
         "argument --cache: '{tmp}/file' exists and is not a folder"),
    Case("build-cache-under-a-file", "cudal2-build", "--cache {tmp}/file/c",
         "argument --cache: folder '{tmp}/file/c' cannot be made"),
    Case("build-db-missing-folder", "cudal2-build", "--measurements {tmp}/no/db.jsonl",
         "argument --measurements: '{tmp}/no/db.jsonl': its folder '{tmp}/no' does not exist"),
    Case("build-db-under-a-file", "cudal2-build", "--measurements {tmp}/file/db.jsonl",
         "its folder '{tmp}/file' is not a folder"),
    Case("build-proposer", "cudal2-build", "--proposer magic", "argument --proposer: invalid"),
    Case("build-unknown-flag", "cudal2-build", "--jbos 4", "unrecognized arguments: --jbos"),
    Case("build-two-manifests", "cudal2-build", "{tmp}/file {tmp}/file",
         "unrecognized arguments"),
    Case("build-manifest-missing", "cudal2-build", "{tmp}/none.toml",
         "{tmp}/none.toml: cannot read manifest: No such file"),
    Case("build-manifest-a-folder", "cudal2-build", "{tmp}/dir",
         "{tmp}/dir: cannot read manifest: not a regular file"),
    Case("build-flag-without-value", "cudal2-build", "--out", "argument --out: expected one"),
    # cudal2-diff (reading A and B is tested with the diff's own faults)
    Case("diff-noise-negative", "cudal2-diff", "{tmp}/file {tmp}/file --noise -1",
         "argument --noise: must be a finite percentage >= 0, got '-1'"),
    Case("diff-noise-nan", "cudal2-diff", "{tmp}/file {tmp}/file --noise nan",
         "argument --noise: must be a finite percentage"),
    Case("diff-noise-inf", "cudal2-diff", "{tmp}/file {tmp}/file --noise inf",
         "argument --noise: must be a finite percentage"),
    Case("diff-noise-word", "cudal2-diff", "{tmp}/file {tmp}/file --noise lots",
         "argument --noise: not a number"),
    Case("diff-regression-negative", "cudal2-diff",
         "{tmp}/file {tmp}/file --fail-on-regression -5", "argument --fail-on-regression"),
    Case("diff-one-input", "cudal2-diff", "{tmp}/file", "the following arguments are required: B"),
    Case("diff-unknown-flag", "cudal2-diff", "{tmp}/file {tmp}/file --jsn",
         "unrecognized arguments: --jsn"),
    Case("diff-format-unknown", "cudal2-diff", "{tmp}/file {tmp}/file --format html",
         "argument --format: invalid choice: 'html'"),
    Case("diff-max-rows-negative", "cudal2-diff", "{tmp}/file {tmp}/file --max-rows -1",
         "argument --max-rows"),
    Case("diff-allow-removed-value", "cudal2-diff", "{tmp}/file {tmp}/file --allow-removed=yes",
         "argument --allow-removed: ignored explicit argument 'yes'"),
    # cudal2-bench and its subcommands
    Case("bench-reps-0", "cudal2-bench", "{tmp}/file --out {tmp}/r.jsonl --reps 0",
         "argument --reps: must be a positive integer"),
    Case("bench-settle-negative", "cudal2-bench",
         "{tmp}/file --out {tmp}/r.jsonl --settle-ms -1",
         "argument --settle-ms: must be an integer >= 0, got '-1'"),
    Case("bench-out-missing-folder", "cudal2-bench", "{tmp}/file --out {tmp}/no/r.jsonl",
         "argument --out: '{tmp}/no/r.jsonl': its folder '{tmp}/no' does not exist"),
    Case("bench-out-a-folder", "cudal2-bench", "{tmp}/file --out {tmp}/dir",
         "argument --out: '{tmp}/dir' is a folder, not a file"),
    Case("bench-no-out", "cudal2-bench", "{tmp}/file",
         "the following arguments are required: --out"),
    Case("bench-kernels-missing", "cudal2-bench",
         "{tmp}/file --out {tmp}/r.jsonl --kernels {tmp}/k.whl",
         "argument --kernels: '{tmp}/k.whl': no such file"),
    Case("bench-dtype", "cudal2-bench", "{tmp}/file --out {tmp}/r.jsonl --dtype fp32",
         "argument --dtype: invalid choice"),
    Case("bench-shapes-missing", "cudal2-bench", "{tmp}/none.toml --out {tmp}/r.jsonl",
         "{tmp}/none.toml: no such shape file"),
    Case("bench-shapes-a-folder", "cudal2-bench", "{tmp}/dir --out {tmp}/r.jsonl",
         "{tmp}/dir: not a regular file"),
    Case("bench-shapes-not-toml", "cudal2-bench", "{tmp}/file --out {tmp}/r.jsonl",
         "{tmp}/file: Expected '=' after a key"),
    Case("summarize-missing", "cudal2-bench", "summarize {tmp}/none.jsonl",
         "argument results: '{tmp}/none.jsonl': no such file"),
    Case("summarize-a-folder", "cudal2-bench", "summarize {tmp}/dir",
         "argument results: '{tmp}/dir' is not a regular file"),
    Case("summarize-m-min-0", "cudal2-bench", "summarize {tmp}/file --m-min 0",
         "argument --m-min: must be a positive integer"),
    Case("summarize-m-range-empty", "cudal2-bench", "summarize {tmp}/file --m-min 5 --m-max 1",
         "--m-min 5 is above --m-max 1"),
    Case("summarize-mode", "cudal2-bench", "summarize {tmp}/file --mode both",
         "argument --mode: invalid choice"),
    Case("plot-output-missing-folder", "cudal2-bench", "plot {tmp}/file -o {tmp}/no/p.png",
         "argument -o/--output: '{tmp}/no/p.png': its folder '{tmp}/no' does not exist"),
    Case("plot-output-a-folder", "cudal2-bench", "plot {tmp}/file -o {tmp}/dir",
         "argument -o/--output: '{tmp}/dir' is a folder, not a file"),
    # cudal2-policy subcommands
    Case("policy-no-command", "cudal2-policy", "",
         "the following arguments are required: command"),
    Case("policy-unknown-command", "cudal2-policy", "tune", "argument command: invalid choice"),
    Case("train-bc-steps-negative", "cudal2-policy", "train --bc-steps -1",
         "argument --bc-steps: must be an integer >= 0"),
    Case("train-seed-negative", "cudal2-policy", "train --seed -1", "argument --seed: must be"),
    Case("train-seed-2**40", "cudal2-policy", "train --seed 1099511627776",
         "argument --seed: must be at most 4294967295"),
    Case("train-db-missing", "cudal2-policy", "train --db {tmp}/none.jsonl.gz",
         "argument --db: '{tmp}/none.jsonl.gz': no such file"),
    Case("train-out-under-a-file", "cudal2-policy", "train --out {tmp}/file/ckpt",
         "argument --out: folder '{tmp}/file' cannot be made"),
    Case("eval-online-negative", "cudal2-policy", "eval --online -1",
         "argument --online: must be a finite number > 0"),
    Case("eval-online-nan", "cudal2-policy", "eval --online nan", "argument --online: must be"),
    Case("eval-policy-seeds-0", "cudal2-policy", "eval --policy-seeds 0",
         "argument --policy-seeds: must be a positive integer"),
    Case("eval-random-seeds-word", "cudal2-policy", "eval --random-seeds all",
         "argument --random-seeds: not an integer"),
    Case("eval-adapter-missing", "cudal2-policy", "eval --adapter {tmp}/lora",
         "argument --adapter: '{tmp}/lora': no such folder"),
    Case("eval-adapter-a-file", "cudal2-policy", "eval --adapter {tmp}/file",
         "argument --adapter: '{tmp}/file': not a folder"),
    Case("eval-out-a-folder", "cudal2-policy", "eval --out {tmp}/dir",
         "argument --out: '{tmp}/dir' is a folder, not a file"),
    Case("eval-plot-missing-folder", "cudal2-policy", "eval --plot {tmp}/no/c.png",
         "argument --plot: '{tmp}/no/c.png': its folder '{tmp}/no' does not exist"),
    Case("adapt-out-a-file", "cudal2-policy", "adapt --db {db} --out {tmp}/file",
         "argument --out: '{tmp}/file' exists and is not a folder"),
    Case("adapt-no-db", "cudal2-policy", "adapt --out {tmp}/lora",
         "the following arguments are required: --db"),
    Case("corpus-db-missing", "cudal2-policy", "corpus --db {tmp}/none.jsonl --out {tmp}/c.gz",
         "argument --db: '{tmp}/none.jsonl': no such file"),
    Case("corpus-out-missing-folder", "cudal2-policy", "corpus --db {db} --out {tmp}/no/c.gz",
         "argument --out: '{tmp}/no/c.gz': its folder '{tmp}/no' does not exist"),
    Case("corpus-holdout-bad-manifest", "cudal2-policy",
         "corpus --db {db} --holdout {tmp}/file --out {tmp}/c.gz", "{tmp}/file: TOML syntax"),
]
# fmt: on


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_command_line_exits_2_in_one_line(tmp_path, monkeypatch, capsys, case):
    (tmp_path / "file").write_text("not a manifest, a table or a shape file\n")
    (tmp_path / "dir").mkdir()
    monkeypatch.chdir(tmp_path)  # defaults (dist/, speedup.png) would land here
    before = _listing(tmp_path)
    argv = case.argv.format(tmp=tmp_path, db=DB).split()
    assert MAINS[case.cli](argv) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"{case.cli}"), err
    assert case.says.format(tmp=tmp_path) in err, err
    assert not captured.out
    assert _listing(tmp_path) == before, "nothing is written"


def test_every_cli_is_covered():
    assert {c.cli for c in CASES} == set(MAINS)
    assert os.path.basename(DB) == "default.measurements.jsonl"
