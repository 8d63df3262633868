"""The layer profile's kernel roles and the layer's read ceiling
(``cudal2.bench.layer_profile``), on the committed H100 profile and read-ceiling records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cudal2.bench import standing
from cudal2.bench.layer_profile import (
    ceiling_rows,
    decode_ceiling_rows,
    load,
    read_times,
    role,
    vendor_times,
)

ROOT = Path(__file__).resolve().parents[2]

# (kernel name as the profiler reports it, its role): one row per kind of kernel the
# committed H100 profile holds, and names it must not mistake.
ROLES = [
    ("hgemm_sm90tma_sm90_fp16_tn_swap0_wg1_mb1_n128_s4_sk1_p0_c1_epi_rmsnorm_silu", "gemm"),
    ("nvjet_sm90_hsh_64x8_64x16_2x1_v_bz_splitK_TNT", "gemm"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, __half>", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35", "attention"),
    ("void cudnn::fusion::lean_reduction_kernel<false, false, false>(void*)", "attention"),
    ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>", "copy"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "elementwise"),
    ("void at::native::vectorized_elementwise_kernel<8, CUDAFunctor_add<Half>>", "elementwise"),
    ("some_kernel_nobody_knows", "other"),
]


@pytest.mark.parametrize(("kernel", "expected"), ROLES)
def test_kernel_roles(kernel, expected):
    assert role(kernel) == expected


def _committed():
    prof = (ROOT / standing.LAYER_PROFILE).read_text()
    reads = (ROOT / standing.READ_CEILING).read_text()
    return prof, reads


def test_every_profiled_case_has_its_gemms_read_times_and_the_ceilings_follow():
    prof, reads = _committed()
    rows = load(prof, reads)
    assert len(rows) == len(json.loads(prof)["cases"]) == 6
    for r in rows:
        assert r["ceiling"] == pytest.approx(r["vendor_us"] / (r["read_us"] + r["cudal2_rest_us"]))
        assert r["ceiling_attention_only"] >= r["ceiling"]  # fewer kernels left, more room
        assert r["cudal2_gemm_us"] > r["read_us"]  # no GEMM beats a pure read of its bytes
    # With today's other kernels the 8B layer cannot beat the vendor's by more than 1.165
    # at any M (docs/inference.md); with only attention left, 1.15 is within reach.
    eight = [r for r in rows if r["model"] == "llama-3.1-8b"]
    assert len(eight) == 3
    assert all(r["ceiling"] < 1.165 and r["ceiling_attention_only"] > 1.15 for r in eight)


def test_a_slower_read_lowers_the_ceiling_and_a_missing_one_drops_the_case():
    prof, reads = _committed()
    doc = json.loads(prof)
    rd = read_times([json.loads(x) for x in reads.splitlines() if x.strip()])
    base = {(r["model"], r["m"]): r for r in ceiling_rows(doc, rd)}
    key = ("fp16", 1, 28672, 4096)  # the 8B gate_up at M = 1
    slower = dict(rd) | {key: rd[key] + 10.0}
    got = {(r["model"], r["m"]): r for r in ceiling_rows(doc, slower)}
    assert got[("llama-3.1-8b", 1)]["ceiling"] < base[("llama-3.1-8b", 1)]["ceiling"]
    assert got[("llama-3.1-8b", 16)] == base[("llama-3.1-8b", 16)]
    missing = {k: v for k, v in rd.items() if k != key}
    assert ("llama-3.1-8b", 1) not in {(r["model"], r["m"]) for r in ceiling_rows(doc, missing)}


def test_the_ceiling_table_is_made_from_its_results_files(tmp_path):
    prof, reads = _committed()
    doc = json.loads(prof)
    doc["cases"][0]["vendor"]["span_us"] = 999.0
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / standing.LAYER_PROFILE).write_text(json.dumps(doc))
    (tmp_path / standing.READ_CEILING).write_text(reads)
    table = standing.layer_ceiling(tmp_path)
    c = doc["cases"][0]
    assert f"| {c['model']} | {c['dtype']} | {c['m']} | 999.0 |" in table
    assert table.count("\n| ") == len(doc["cases"]) + 1


def test_the_splitk_epilogue_table_is_made_from_the_layer_database(tmp_path):
    """Each M = 1 epilogue target is a row; a record made faster moves its column and the
    ratio; records of other M are not rows."""
    import gzip

    from cudal2.database import MeasurementDB, latest

    ms = latest(MeasurementDB(ROOT / standing.LAYER_DB).read())
    table = standing.splitk_epilogues(ROOT)
    m1 = {m.target for m in ms if m.target.m == 1 and m.target.epilogue != "none"}
    assert table.count("\n| ") == len(m1) + 1 == 17
    # the fastest sm90direct residual record of one target, made 40 µs: its row shows it
    t = next(t for t in sorted(m1, key=str) if t.epilogue == "residual" and t.dtype == "fp16")
    fastest = min(
        (m for m in ms if m.target == t and m.status == "ok" and m.design is not None
         and m.design.family in standing.SPLITK_FAMILIES),
        key=lambda m: m.median_us,
    )  # fmt: skip
    with gzip.open(ROOT / standing.LAYER_DB, "rt") as f:
        lines = f.read().splitlines()
    out = []
    for line in lines:
        rec = json.loads(line)
        if (rec.get("design_key"), rec.get("median_us")) == (fastest.design_key, fastest.median_us):
            # 40 µs: faster than every record, above the shape's physical floor; the
            # samples scaled too (a record whose median is not theirs is refused on read)
            k = 40.0 / rec["median_us"]
            rec["median_us"], rec["samples_us"] = 40.0, [x * k for x in rec["samples_us"]]
        out.append(json.dumps(rec))
    (tmp_path / standing.LAYER_DB).parent.mkdir(parents=True)
    with gzip.open(tmp_path / standing.LAYER_DB, "wt") as f:
        f.write("\n".join(out) + "\n")
    changed = standing.splitk_epilogues(tmp_path)
    assert t.n * t.k == 4096 * 14336  # the first fp16 residual target by name
    row = next(x for x in changed.splitlines() if f"| fp16 | {t.n}×{t.k} | residual | 40.0 |" in x)
    assert row.endswith(f"| {fastest.baselines_us['torch'] / 40.0:.3f} |")


# -- the whole decode step (issue 21's end to end; bench/experiments/kv_decode_profile.py) --


def _decode(**changes):
    prof = json.loads((ROOT / standing.KV_PROFILE).read_text())
    e2e = json.loads((ROOT / standing.KV_E2E).read_text())
    ceil = [json.loads(x) for x in (ROOT / standing.READ_CEILING).read_text().splitlines() if x]
    bench = {b: r["ms_per_step"] for b, r in e2e["llama"]["graph"]["batches"].items()}
    args = (
        dict(
            profile=prof,
            reads=read_times(ceil),
            read_tbps=max(r["read_tbps"] for r in ceil),
            bench_ms=bench,
            targets=standing.KV_TARGETS,
            vendors=vendor_times(ceil),
        )
        | changes
    )
    return {r["batch"]: r for r in decode_ceiling_rows(**args)}, args


def test_the_decode_ceiling_sums_the_profiled_kernels_by_role():
    rows, args = _decode()
    assert sorted(rows) == [1, 16, 64]
    for b, r in rows.items():
        patched = args["profile"]["batches"][str(b)]["patched"]["kernels"]
        rest = sum(k["us_per_step"] for k in patched if role(k["kernel"]) != "gemm")
        assert r["patched_rest_us"] == pytest.approx(rest)
        # 32 layers' GEMMs and the 1 GB LM head read once per step: ~5 ms on the H100
        assert 4900 < r["read_us"] < 5300
        assert r["ceiling_bench"] == pytest.approx(r["bench_unpatched_us"] / (r["read_us"] + rest))
        assert r["ceiling_attention_only"] >= r["ceiling"]


def test_which_decode_targets_are_within_reach_of_the_measured_kernels():
    """docs/inference.md's reading of the table: at batch 16 the GEMMs would have to run
    faster than any measured kernel runs in isolation; at batch 1 they need not."""
    rows, _ = _decode()
    assert rows[16]["gemm_fraction_needed"] > rows[16]["vendor_fraction"]
    assert rows[1]["gemm_fraction_needed"] < rows[1]["vendor_fraction"]
    assert all(r["gemm_fraction_now"] < r["vendor_fraction"] for r in rows.values())


def test_a_lower_target_or_a_faster_read_needs_slower_gemms():
    rows, args = _decode()
    easier, _ = _decode(targets={b: t - 0.02 for b, t in args["targets"].items()})
    faster, _ = _decode(read_tbps=args["read_tbps"] * 2)
    for b in rows:
        assert easier[b]["gemm_fraction_needed"] < rows[b]["gemm_fraction_needed"]
        assert faster[b]["read_us"] < rows[b]["read_us"]
    missing = {k: v for k, v in args["reads"].items() if k != ("fp16", 16, 28672, 4096)}
    assert 16 not in _decode(reads=missing)[0]


# kernel_table: (kernels as (name, start, end, GPU µs), per, unit) -> (per kernel name:
# (µs, launches, idle before), kernel sum, span, idle), all per unit
KERNEL_TABLES = [
    pytest.param(
        [("hgemm_a", 0, 10, 10), ("triton_b", 12, 20, 8), ("hgemm_a", 25, 30, 5)], 1,
        {"hgemm_a": (15, 2, 5), "triton_b": (8, 1, 2)}, 23, 30, 7, id="gaps",
    ),
    pytest.param(  # PDL: b starts inside a and waits there: durations overlap, no idle
        [("hgemm_a", 0, 10, 10), ("hgemm_b", 5, 20, 15)], 1,
        {"hgemm_a": (10, 1, 0), "hgemm_b": (15, 1, 0)}, 25, 20, 0, id="pdl-overlap",
    ),
    pytest.param(  # c's gap counts from a's end, the latest end before it, not b's
        [("hgemm_a", 0, 30, 30), ("sdpa_b", 5, 10, 5), ("hgemm_c", 32, 40, 8)], 1,
        {"hgemm_a": (30, 1, 0), "sdpa_b": (5, 1, 0), "hgemm_c": (8, 1, 2)}, 43, 40, 2,
        id="nested",
    ),
    pytest.param(  # two steps: everything halved
        [("hgemm_a", 100, 110, 10), ("hgemm_a", 114, 124, 10)], 2,
        {"hgemm_a": (10, 1, 2)}, 10, 12, 2, id="per-two", 
    ),
    pytest.param(  # unsorted input: sorted by start first
        [("hgemm_a", 25, 30, 5), ("hgemm_a", 0, 10, 10), ("triton_b", 12, 20, 8)], 1,
        {"hgemm_a": (15, 2, 5), "triton_b": (8, 1, 2)}, 23, 30, 7, id="unsorted",
    ),
]  # fmt: skip


@pytest.mark.parametrize("kernels, per, want, total, span, idle", KERNEL_TABLES)
@pytest.mark.parametrize("unit", ["step", "layer"])
def test_kernel_table(kernels, per, want, total, span, idle, unit):
    from cudal2.bench.layer_profile import kernel_table

    got = kernel_table(kernels, per, unit)
    rows = {r["kernel"]: r for r in got["kernels"]}
    assert {k: (r[f"us_per_{unit}"], r[f"launches_per_{unit}"],
                r[f"idle_before_us_per_{unit}"]) for k, r in rows.items()} == want  # fmt: skip
    assert [r["kernel"] for r in got["kernels"]] == sorted(want, key=lambda k: -want[k][0])
    assert (got["kernel_sum_us"], got["span_us"], got["idle_us"]) == (total, span, idle)
    assert got[f"launches_per_{unit}"] == round(len(kernels) / per, 2)
    assert sum(got["by_role_us"].values()) == pytest.approx(total)
