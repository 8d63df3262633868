"""Issue 22's declared timing state (``cudal2.bench.declared``) against the committed
H100 results: its per-shape figures agree with ``cudal2-bench summarize``'s geomean, and
its regime split covers every repetition of every record it reads."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from cudal2.bench import declared
from cudal2.bench.llm_public_steps import geomeans, runs
from cudal2.bench.runoffs import public_shapes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("state", ["", "settled-"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_per_shape_speedups_give_the_summaries_geomean(state, dtype):
    only = public_shapes(ROOT)
    rows = runs(ROOT, declared._paths("h100-prefill-llm-public", state, "c", 2))
    for (_, r), g in zip(rows, geomeans(rows, "offline", dtype, "best_vendor", only), strict=True):
        each = declared.per_shape(r, "offline", dtype, only)
        assert len(each) == 16
        assert math.exp(sum(map(math.log, each.values())) / 16) == pytest.approx(g, abs=5e-4)


def test_the_regime_split_holds_every_repetition_and_the_settled_run_offs():
    text = declared.regimes(ROOT)
    rows = [line for line in text.splitlines() if re.match(r"\| (settled run-off, )?20", line)]
    assert len(rows) == 9  # seven records of the algorithm, two settled run-offs beside it
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert int(cells[3]) + int(cells[5]) == 30
    assert sum(line.startswith("| settled run-off") for line in rows) == 2
