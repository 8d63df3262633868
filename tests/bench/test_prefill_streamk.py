"""The stream-K slice's generated blocks (``cudal2.bench.prefill_streamk``) from the
committed H100 sweep and ncu files."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudal2.bench import prefill_streamk as ps

ROOT = Path(__file__).resolve().parents[2]


def test_each_target_row_reads_the_sweep_and_the_geomean_its_rows():
    text = ps.tma_v5_streamk(ROOT)
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 17
    # the largest loss: 1024x4096x14336's stream-K designs over their twins
    (row,) = [r for r in rows if r.startswith("| 1024×4096×14336 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].startswith("0.730 (128x256/3)") and cells[5].startswith("0.647")
    geo = text.splitlines()[-1]
    assert geo.startswith("| geomean | 0.816 |")


def test_the_ncu_block_reads_each_role_of_each_file(tmp_path):
    text = ps.ncu_streamk(ROOT)
    assert "| DRAM read (MB) | 455.76 | 146.82 | 59.15 | 60.91 |" in text
    # a file whose stream-K kernel read less: the block follows the file
    for p in ps.NCU_STREAMK:
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / p, tmp_path / p)
    path = tmp_path / ps.NCU_STREAMK[0]
    path.write_text(path.read_text().replace('"455.76"', '"100.00"'))
    assert "| DRAM read (MB) | 100.00 | 146.82 |" in ps.ncu_streamk(tmp_path)


# (id, the command line after the script, what stderr says): each exits 2 before torch
NCU_STREAMK_REFUSED = [
    ("shape-not-in-db", ["--shape", "8", "8", "8"], "no timed fp16 stream-K record at (8, 8, 8)"),
    ("no-such-db", ["--db", "no/such.jsonl.gz"], "No such file"),
]


@pytest.mark.parametrize(
    "case_id, args, says", NCU_STREAMK_REFUSED, ids=[c[0] for c in NCU_STREAMK_REFUSED]
)
def test_ncu_streamk_refuses_a_target_its_database_lacks(case_id, args, says):
    script = ROOT / "bench" / "experiments" / "ncu_streamk.py"
    cmd = [sys.executable, str(script), "--db", str(ROOT / ps.STREAMK_SWEEP), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and says in r.stderr, r.stderr
