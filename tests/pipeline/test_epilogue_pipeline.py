"""A build whose manifest asks for fused epilogues, on the CPU, up to what needs no
measurement (there is no GPU data for epilogue targets yet): the dry run's counts, and
the exported measuring job (compiled cubins of sm90tma designs with the epilogue, ABI
gemm_v3, only for the epilogue's targets; no cuBLASLt autotune of them)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

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


def test_the_ci_epilogue_job_plans_the_gated_set_on_one_tile_designs():
    from cudal2.generator import legality
    from cudal2.generator.families.base import epilogue, with_epilogue

    job = _epilogue_job()
    plan = job.plan("gated")
    want = {(6144, 4096, "rmsnorm"), (28672, 4096, "rmsnorm_silu")}
    assert {(t.n, t.k, t.epilogue) for t, _ in plan if t.epilogue != "none"} == want
    assert {t.m for t, _ in plan} == {1, 16, 64}
    assert {t.dtype for t, _ in plan} == {"fp16", "bf16"}
    tiles: dict = {}
    for t, d in plan:
        assert d.family == "sm90tma" and d.dtype == t.dtype and epilogue(d) == t.epilogue
        assert d.knobs.persistent == 0 and legality(d) == []
        tiles.setdefault((t.dtype, t.m, t.n, t.epilogue), set()).add(with_epilogue(d, "none"))
    # each tile plain and fused, two or three tiles per target
    for (dtype, m, n, e), ds in tiles.items():
        if e != "none":
            assert ds == tiles[(dtype, m, n, "none")] and 2 <= len(ds) <= 3
    with pytest.raises(ValueError, match="unknown set 'gelu'"):
        job.plan("gelu")


def test_the_ci_epilogue_summary_keeps_dtypes_apart():
    job = _epilogue_job()

    def row(dtype, e, us, torch_us):
        return {"dtype": dtype, "m": 1, "n": 6144, "k": 4096, "epilogue": e,
                "kernel": f"a_{e}", "tile": "a", "status": "ok", "median_us": us,
                "torch_us": torch_us, "max_abs_err": 0.01, "bound_from": 0.02}  # fmt: skip

    rows = [row("fp16", "none", 9.0, 8.0), row("bf16", "none", 7.0, 8.0),
            row("fp16", "rmsnorm", 10.0, 20.0), row("bf16", "rmsnorm", 8.0, 16.0)]  # fmt: skip
    s = job.summarize(rows)
    got = {(r["dtype"], r["plain_kernel_us"], r["unfused_over_fused"]) for r in s["rows"]}
    assert got == {("fp16", 9.0, 2.0), ("bf16", 7.0, 2.0)}


def test_a_recorded_persistent_design_is_left_out_of_the_gated_set():
    """Only the one-tile kernel renders the gated and row-scaled epilogues: a recorded
    persistent best is skipped, the fixed split-K designs stay."""
    from cudal2.generator.families import sm90_tma

    job = _epilogue_job()
    persistent = sm90_tma.design("bf16", 2, 1, True, 128, 6, 1, pers=1)
    one_tile = sm90_tma.design("bf16", 1, 1, True, 32, 8, 1)
    for recorded, first in (({(16, 6144, 4096): persistent}, None),
                            ({(16, 6144, 4096): one_tile}, one_tile)):  # fmt: skip
        got = job.gated_designs_for("bf16", 1, 6144, 4096, "rmsnorm", recorded)
        splits = [d.knobs.split_k for d in got]
        assert (got[0] == first) if first else persistent not in got
        assert splits[-2:] == [2, 4]
