"""``ci/gpu_steps.sh`` on this machine (it runs no GPU itself): each step under an OUT of
its own, and what comes back of it (docs/gpu.md, "What comes back": 8 files a call) is
its databases gzipped, its JSON, and one tar of the rest without wheels, each named by
the step; a failing step does not stop the next, and the exit status is the first
failure's; a malformed step is refused (exit 2) before anything runs."""

from __future__ import annotations

import gzip
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "ci" / "gpu_steps.sh"

# A step that writes what the GPU scripts write: a database, a JSON result, logs, a wheel.
WRITES = (
    "echo '{\"x\": 1}' > $OUT/db.measurements.jsonl; echo '{\"r\": 2}' > $OUT/res.json; "
    "mkdir -p $OUT/dist; echo log > $OUT/build.txt; echo wheel > $OUT/dist/p-0.1-py3-none-any.whl"
)


def _run(tmp_path: Path, *steps: str) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {"OUT": str(out), "STEPS_DIR": str(tmp_path / "work"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", str(SCRIPT), *steps], env=env, capture_output=True, text=True, timeout=60
    )
    return done, out


def test_each_step_comes_back_as_its_databases_json_and_one_tar(tmp_path):
    done, out = _run(tmp_path, f"fused: {WRITES}; exit 3", "tenth-2: echo ok > $OUT/t.txt")
    assert done.returncode == 3, done.stderr  # the first failing step's status
    assert sorted(p.name for p in out.iterdir()) == [
        "fused-db.measurements.jsonl.gz", "fused-logs.tgz", "fused-res.json", "tenth-2-logs.tgz",
    ]  # fmt: skip
    with gzip.open(out / "fused-db.measurements.jsonl.gz", "rt") as f:
        assert json.loads(f.read()) == {"x": 1}
    assert json.loads((out / "fused-res.json").read_text()) == {"r": 2}
    with tarfile.open(out / "fused-logs.tgz") as tar:
        assert sorted(tar.getnames()) == ["./build.txt"]  # no wheel, no database, no JSON
    with tarfile.open(out / "tenth-2-logs.tgz") as tar:
        assert tar.getnames() == ["./t.txt"]
    assert "=== step tenth-2: exit 0" in done.stdout


@pytest.mark.parametrize("step", ["no colon here", "bad name: true", ": true", "a/b: true"])
def test_a_malformed_step_is_refused_before_anything_runs(tmp_path, step):
    done, out = _run(tmp_path, "first: echo ran > $OUT/ran.txt", step)
    assert done.returncode == 2
    assert "is not '<step>: <command>'" in done.stderr
    assert not (tmp_path / "work" / "first").exists() and list(out.iterdir()) == []
