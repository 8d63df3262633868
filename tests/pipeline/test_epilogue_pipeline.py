"""A build whose manifest asks for fused epilogues, on the CPU, up to what needs no
measurement (there is no GPU data for epilogue targets yet): the dry run's counts, and
the exported measuring job (compiled cubins of sm90tma designs with the epilogue, ABI
gemm_v3, only for the epilogue's targets; no cuBLASLt autotune of them)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from cudal2.cli import build as build_cli
from cudal2.manifest import load_manifest
from cudal2.pipeline.job import read_job
from cudal2.pipeline.split import export_job

CONFIG = Path(__file__).resolve().parents[1] / "cudal2" / "configs" / "llama-3.1-70b"
GPU = "NVIDIA H100 80GB HBM3"


def _manifest(tmp_path: Path, candidates: int = 2, families: str = "") -> Path:
    path = tmp_path / "epi.toml"
    path.write_text(
        '[package]\nname = "epi"\nversion = "0.1.0"\n'
        f"[search]\nproposer = 'grid'\ncandidates = {candidates}\nrounds = 1\n{families}"
        f"[[model]]\nconfig = '{CONFIG}'\ntokens = [16]\ntp = 8\n"
        "epilogues = { o = ['residual'], down = ['bias_residual'] }\n"
    )
    return path


def test_the_dry_run_counts_the_epilogue_targets(tmp_path, capsys):
    m = _manifest(tmp_path)
    args = [str(m), "--dry-run", "--json", "--gpu", GPU, "--cache", str(tmp_path / "cache")]
    assert build_cli.main(args) == 0
    s = json.loads(capsys.readouterr().out)
    # llama-3.1-70b tp 8 at M 16: 4 plain projections + o residual + down bias_residual
    assert s["targets"] == 6
    assert s["candidates"] == 6 * 2
    assert s["autotune"] == 4  # cuBLASLt tunes the plain GEMMs only
    fused = [t for t in s["target_list"] if "epilogue" in t]
    assert sorted(t["epilogue"] for t in fused) == ["bias_residual", "residual"]


def test_the_exported_job_measures_epilogue_designs_for_epilogue_targets(tmp_path, artifact_cache):
    manifest = load_manifest(_manifest(tmp_path, 1, "families = ['sm90tma']\n"))
    out = tmp_path / "job"
    export_job(manifest, tmp_path / "db.jsonl", artifact_cache, out, gpu=GPU, log=io.StringIO())
    job = read_job(out)
    assert len(job.measure) == 6
    for answer in job.measure:
        j = answer.job
        fused = j.target.epilogue
        assert j.design is not None and j.design.family == "sm90tma"
        if fused == "none":
            assert j.recipe["abi"] == "gemm_v2" and "epilogue" not in j.recipe
            assert "_epi_" not in j.symbol
        else:
            assert j.recipe["abi"] == "gemm_v3" and j.recipe["epilogue"] == fused
            assert j.symbol.endswith(f"_epi_{fused}")
        assert (out / "cubins" / f"{j.artifact_key}.cubin").is_file()
    assert {a.job.target.epilogue for a in job.measure} == {"none", "residual", "bias_residual"}
    assert all(t.epilogue == "none" for t in job.autotune)
