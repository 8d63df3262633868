"""ci/host_runner_check.py on CPU, over the committed H100 build of
manifests/llama-3.1-8b-h100.toml (the one-GPU build before the host runner): nothing
measured twice, every target's 4 x 8 proposals present; a record measured a second time
or a target missing its proposals fails the check."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "manifests" / "llama-3.1-8b-h100.toml"
DB = ROOT / "manifests" / "llama-3.1-8b-h100.measurements.jsonl.gz"


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location(
        "host_runner_check", ROOT / "ci" / "host_runner_check.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_committed_build_measured_every_job_once(check, capsys):
    assert check.main([str(DB), str(MANIFEST), "--runner", "local"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["measured_twice"] == [] and out["targets_short"] == {}
    assert out["records"] > out["reuse_keys"]  # profiled copies repeat their keys
    assert out["cublaslt_records"] == out["targets"] == 24


@pytest.mark.parametrize("fault", ["measured twice", "a target short", "build failed"])
def test_the_check_fails_what_it_must(check, tmp_path, capsys, fault):
    with gzip.open(DB, "rt") as f:
        lines = f.read().splitlines()
    exit_code = "0"
    if fault == "measured twice":  # one record again, its samples in another order
        d = next(json.loads(ln) for ln in lines if len(json.loads(ln).get("samples_us", [])) > 1)
        d["samples_us"] = d["samples_us"][::-1]
        lines.append(json.dumps(d))
    elif fault == "a target short":  # one design's records of one target gone
        victim = next(json.loads(ln) for ln in lines if json.loads(ln).get("design"))
        lines = [
            ln
            for ln in lines
            if (json.loads(ln).get("design_key"), json.loads(ln).get("target"))
            != (victim["design_key"], victim["target"])
        ]
    else:
        exit_code = "1"
    db = tmp_path / "db.jsonl"
    db.write_text("\n".join(lines) + "\n")
    assert check.main([str(db), str(MANIFEST), "--exit", exit_code]) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"]
    if fault == "measured twice":
        assert len(out["measured_twice"]) == 1
    if fault == "a target short":
        assert len(out["targets_short"]) == 1
