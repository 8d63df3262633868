"""Issue 22's tenth-slice block (``cudal2.bench.prefill_uniform``) from the committed SASS
counts: each row is the file's two listings of one kernel, a changed count changes the
table, and a count that must not change (HGMMA, registers, local memory) is refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cudal2.bench import prefill_uniform as pu
from cudal2.generator.families import sm90_tma

ROOT = Path(__file__).resolve().parents[2]


def _doc(path: str = pu.SASS_UNIFORM) -> dict:
    return json.loads((ROOT / path).read_text())


def _copy(tmp_path: Path, doc: dict, path: str = pu.SASS_UNIFORM) -> Path:
    """A root holding ``doc`` as the results file ``path``."""
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(json.dumps(doc))
    return tmp_path


def test_each_row_is_one_kernel_with_and_without_the_broadcast():
    doc = _doc()
    rows = {(r["label"], r["uniform"]): r for r in doc["rows"]}
    assert len(rows) == len(doc["rows"]) == 2 * len(pu_labels := {r["label"] for r in doc["rows"]})
    block = pu.sass_uniform(ROOT)
    for label in pu_labels:
        a, b = rows[(label, 0)], rows[(label, 1)]
        assert b["design"] == a["design"] + "_uniwgu"  # the same design, the knob set
        assert b["r2ur"] < a["r2ur"] and b["instructions"] < a["instructions"]
        assert f"| {label} | {a['instructions']} → {b['instructions']} | " in block
    # the file's designs are the experiment's, every one of them
    path = ROOT / "bench" / "experiments" / "sass_uniform.py"
    spec = importlib.util.spec_from_file_location("sass_uniform", path)
    sass_uniform = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass_uniform)
    assert pu_labels == set(sass_uniform.DESIGNS)
    assert all(sm90_tma.v5(d, "uniform") == 0 for d in sass_uniform.DESIGNS.values())


def test_a_changed_count_changes_the_block(tmp_path):
    doc = _doc()
    doc["rows"][1]["r2ur"] += 1000
    assert pu.sass_uniform(_copy(tmp_path, doc)) != pu.sass_uniform(ROOT)


# Counts the broadcast must not change: (field, the value written into a uniform = 1 row).
INVARIANT = [("hgmma", 0), ("registers", 255), ("local", 4), ("spill_bytes", 16)]


@pytest.mark.parametrize(("field", "value"), INVARIANT, ids=[f for f, _ in INVARIANT])
def test_a_changed_invariant_is_refused(tmp_path, field, value):
    doc = _doc()
    row = next(r for r in doc["rows"] if r["uniform"] == 1)
    row[field] = value
    with pytest.raises(ValueError, match=field):
        pu.sass_uniform(_copy(tmp_path, doc))


def test_the_fused_prefill_block_reads_each_fused_design_beside_its_plain_twin():
    """``fused_prefill`` from the committed H200 database: a row per fused target, its
    count of designs measured on both targets, and the fastest fused kernel's time and
    torch's beside it, recomputed here from the records."""
    import gzip

    block = pu.fused_prefill(ROOT)
    with gzip.open(ROOT / pu.FUSED_PREFILL) as f:
        rows = [json.loads(line) for line in f]
    kernels = [r for r in rows if r.get("status") == "ok" and r.get("design")]
    fused = {}
    for r in kernels:
        t = r["target"]
        fused.setdefault((t["m"], t["n"], t["k"], t.get("epilogue", "none")), []).append(r)
    epilogues = [key for key in fused if key[3] != "none"]
    assert len(epilogues) == 3 and len(block.splitlines()) == 4 + len(epilogues)
    for m, n, k, epi in epilogues:
        best = min(fused[(m, n, k, epi)], key=lambda r: r["median_us"])
        torch_us = best["baselines_us"]["torch"]
        assert f"| {m}×{n}×{k} | {epi} | " in block
        assert (
            f"| {best['median_us']:.1f} ({torch_us:.1f}) | {torch_us / best['median_us']:.3f} |"
            in block
        )


def test_the_tenth_block_reads_a_sweep_without_its_techniques_as_the_ring_block_does():
    """``tma_v5_tenth`` (its sweep's database not yet committed) on the ring sweep, which
    holds none of the tenth's techniques: the fastest kernel is the fastest without them
    on every target, the gain is 1, and the summary row is the ring block's own."""
    from cudal2.bench import prefill_narrow_pair as pnp

    ring = {"fp16": pnp.RING_SWEEP}
    block = pu.tma_v5_tenth(ROOT, ring)
    rows = [x for x in block.splitlines() if x.startswith("| fp16 | ") and "×" in x]
    assert len(rows) == 17
    for row in rows:
        cells = row.split(" | ")
        assert cells[2] == cells[3]  # the fastest is one of the ninth slice's designs
    assert "fastest over fastest without: fp16 1.000." in block
    summary = next(x for x in block.splitlines() if x.startswith("| fp16 | 1."))
    assert summary.split(" | ")[3] in pnp.tma_v5_ring(ROOT)  # TMA store / cuBLASLt
    with pytest.raises(ValueError, match="none of"):
        pu.tma_v5_tenth(ROOT, {"fp16": "bench/results/no-such.measurements.jsonl.gz"})


# -- the twelfth slice's SASS (bench/results/sass-epilogue.json) ------------------------


def test_the_epilogue_sass_shows_r_by_tma_and_the_fast_activation():
    """Each kernel's variants as the experiment makes them; R by TMA leaves no global
    load of R and one ldmatrix a stmatrix; the fast SiLU no call and no FCHK."""
    doc = _doc(pu.SASS_EPILOGUE)
    rows = {(r["kernel"], r["variant"]): r for r in doc["rows"]}
    path = ROOT / "bench" / "experiments" / "sass_epilogue.py"
    spec = importlib.util.spec_from_file_location("sass_epilogue", path)
    exp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exp)
    assert set(rows) == {(k, v[0]) for k in exp.KERNELS for v in exp.VARIANTS}
    block = pu.sass_epilogue(ROOT)
    for kernel in exp.KERNELS:
        scalar, tma = rows[(kernel, "residual")], rows[(kernel, "residual, R by TMA")]
        assert scalar["ldg"] > 0 and tma["ldg"] == 0 and tma["ldsm"] > 0
        assert tma["instructions"] < scalar["instructions"]
        accurate, fast = rows[(kernel, "silu, accurate")], rows[(kernel, "silu, fast")]
        assert accurate["call"] > 0 and fast["call"] == fast["fchk"] == 0
        assert fast["instructions"] < accurate["instructions"]
        assert f"| {kernel} | silu, fast | {fast['instructions']:,} |" in block


@pytest.mark.parametrize(("field", "value"), [("registers", 255), ("spill_bytes", 8), ("local", 2)])
def test_an_epilogue_variant_off_its_twins_registers_or_in_local_memory_is_refused(
    tmp_path, field, value
):
    doc = _doc(pu.SASS_EPILOGUE)
    doc["rows"][2][field] = value
    with pytest.raises(ValueError, match=field if field == "registers" else "spill|local"):
        pu.sass_epilogue(_copy(tmp_path, doc, pu.SASS_EPILOGUE))


def test_the_ncu_rows_block_counts_every_stall_sample_into_its_class():
    """The committed H100 run: each class's samples are those of its opcodes in the
    source counters, the total every line's; the row scale's arithmetic shows only in
    the row-scaled kernel."""
    total, by = pu._ncu_stalls(ROOT / pu.NCU_ROWS["rows"][1])
    ptotal, pby = pu._ncu_stalls(ROOT / pu.NCU_ROWS["plain"][1])
    assert sum(by.values()) < total and sum(pby.values()) < ptotal
    assert by["fp16/fp32 arithmetic"] > 20 * pby["fp16/fp32 arithmetic"]
    text = pu.ncu_rows(ROOT)
    assert f"| all | {total} | {ptotal} |" in text
    name, details = pu._ncu_details(ROOT / pu.NCU_ROWS["rows"][0])
    assert name.endswith("_epi_rmsnorm") and f"| Duration | {details['Duration']} |" in text


def test_the_tenth_block_reads_the_h100_sweeps_as_the_h200_ones():
    """The same block over the H100's databases: its GPU, its files, its figures."""
    text = pu.tma_v5_tenth(ROOT, pu.TENTH_SWEEPS_H100)
    assert text.startswith("H100 80GB HBM3, `bench/results/h100-sweep-tma-v5-tenth.")
    assert text != pu.tma_v5_tenth(ROOT)
    assert sum(line.startswith("| fp16 | ") and "×" in line for line in text.splitlines()) == 17
