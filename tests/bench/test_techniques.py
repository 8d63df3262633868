"""Issue 22's ledger of techniques (``cudal2.bench.techniques``) from the committed sweeps:
its best for best agrees with the first slices' own reading (``schedules.technique_gain``)
and its like for like with the ring counter's block (each design over its twin); every
measured technique has both sides in its sweep, one dtype a sweep; a sweep where a
technique has no kernel without it (or two dtypes) is refused."""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from cudal2.bench import techniques as tq
from cudal2.bench.schedules import technique_gain, timed
from cudal2.database import MeasurementDB, latest

ROOT = Path(__file__).resolve().parents[2]


def _named(name: str) -> tq.Technique:
    (t,) = [t for t in tq.TECHNIQUES if t.name == name]
    return t


# (the ledger's technique, schedules' knob): the first slices' technique table reads the
# best persistent cooperative kernel with the knob over the best without, as best for best
FIRST = [
    ("bulk store through a C buffer", "store"),
    ("grouped tile walk", "raster"),
    ("128 CTAs, not one per SM", "ctas"),
    ("tile N not a power of two", "wgmma_n"),
    ("ping-pong consumers", "persistent"),
]


@pytest.mark.parametrize(("name", "knob"), FIRST)
def test_best_for_best_is_the_first_slices_technique_gain(name, knob):
    t = _named(name)
    for path, g in zip(t.sweeps, tq.gains(ROOT, t), strict=True):
        by_target = timed(latest(MeasurementDB(ROOT / path).read()))
        gain, n = technique_gain(by_target, knob)
        assert g.best[2] == n and g.best[0] == pytest.approx(gain, rel=1e-12), path


def test_like_for_like_of_the_ring_counter_is_each_design_over_its_twin():
    """The ring sweep measured each design with and without the counter and nothing
    else, so its groups are exactly the ninth slice's twins (255 of 272 above 1 there)."""
    (g,) = tq.gains(ROOT, _named("ring slot and phase as counters"))
    block = (ROOT / "docs" / "kernels.md").read_text()
    assert f"| every design | {g.like[0]:.3f} | {g.like[1]} of {g.like[2]} |" in block
    assert g.like[2] == 272 and g.gpu == "NVIDIA H200" and g.dtype == "fp16"


def test_every_measured_technique_reads_one_dtype_a_sweep_and_both_sides():
    block = tq.ledger(ROOT)
    for t in tq.TECHNIQUES:
        measured = tq.gains(ROOT, t)
        assert len(measured) == len(t.sweeps)
        assert [g.dtype for g in measured] == ["fp16", "bf16"][: len(t.sweeps)], t.name
        for g in measured:
            assert g.like[2] >= g.best[2] > 0 and 0 <= g.best[1] <= g.best[2]
            assert (
                f"| {t.name} | {t.slice} | {g.gpu.removeprefix('NVIDIA ')} | {g.dtype} |" in block
            )
        if not t.sweeps:
            assert f"| {t.name} | {t.slice} | not yet run |" in block


def _one_sided(tmp_path: Path, path: str) -> Path:
    """A copy of ``path`` keeping only the kernels of the ring counter (and cuBLASLt)."""
    (tmp_path / path).parent.mkdir(parents=True)
    with gzip.open(ROOT / path, "rt") as src, gzip.open(tmp_path / path, "wt") as dst:
        for line in src:
            rec = json.loads(line)
            if rec.get("design") is None or rec["design"]["knobs"].get("ring", 0) == 1:
                dst.write(line)
    return tmp_path


def _two_dtypes(tmp_path: Path, path: str) -> Path:
    """``path`` and its bf16 twin in one database."""
    (tmp_path / path).parent.mkdir(parents=True)
    shutil.copy(ROOT / path, tmp_path / path)
    bf16 = ROOT / path.replace(".measurements", "-bf16.measurements")
    with gzip.open(tmp_path / path, "at") as dst, gzip.open(bf16, "rt") as src:
        dst.write(src.read())
    return tmp_path


# (case, the technique, how its first sweep is broken, what the refusal says)
REFUSED = [
    ("no kernel without it", "ring slot and phase as counters", _one_sided, "no kernel of"),
    ("two dtypes in a sweep", "epilogue under the next tile", _two_dtypes, "one dtype a sweep"),
]


@pytest.mark.parametrize(("case", "name", "break_", "says"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_sweep_the_ledger_cannot_read_is_refused(tmp_path, case, name, break_, says):
    t = _named(name)
    root = break_(tmp_path, t.sweeps[0])
    with pytest.raises(ValueError, match=says):
        tq.gains(root, replace(t, sweeps=t.sweeps[:1]))
