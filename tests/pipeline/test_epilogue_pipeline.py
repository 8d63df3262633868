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


def _epilogue_job():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "ci" / "epilogue_job.py"
    spec = importlib.util.spec_from_file_location("epilogue_job", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ci_epilogue_job_plans_each_design_plain_and_fused():
    from cudal2.generator.families.base import epilogue, with_epilogue

    job = _epilogue_job()
    plan = job.plan()
    assert len(plan) == 3 * 2 * 2 * 4  # M x shapes x designs x (plain + 3 epilogues)
    assert {(t.n, t.k) for t, _ in plan} == {(4096, 4096), (4096, 14336)}
    assert {t.m for t, _ in plan} == {1, 16, 64}
    tiles = {}
    for t, d in plan:
        assert d.family == "sm90tma" and epilogue(d) == t.epilogue
        tiles.setdefault((t.m, t.n, t.k), set()).add(with_epilogue(d, "none"))
    assert all(len(v) == 2 for v in tiles.values())


def test_the_ci_epilogue_summary_takes_the_fastest_correct_fused_kernel():
    job = _epilogue_job()

    def row(e, tile, us, status="ok", torch_us=20.0):
        return {"m": 16, "n": 4096, "k": 4096, "epilogue": e, "kernel": f"{tile}_{e}",
                "tile": tile, "status": status, "median_us": us, "torch_us": torch_us,
                "max_abs_err": 0.01, "bound_from": 0.02}  # fmt: skip

    rows = [row("none", "a", 9.0), row("none", "b", 8.0), row("residual", "a", 10.0),
            row("residual", "b", 5.0, status="incorrect"), row("residual", "b", 11.0)]  # fmt: skip
    s = job.summarize(rows)
    (r,) = s["rows"]
    assert r["kernel"] == "a_residual" and r["fused_us"] == 10.0
    assert r["plain_kernel_us"] == 9.0 and r["unfused_over_fused"] == 2.0
    assert s["geomean_unfused_over_fused"] == 2.0
