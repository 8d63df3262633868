import gzip
import json
import math

import pytest

from cudal2.policy.corpus import CorpusError, collect, load, write
from cudal2.policy.reward import FAILURE, neighbours, reward

from .conftest import DEFAULT_DB, SMALL_HOLDOUT


def test_committed_corpus_is_large_real_and_varied(committed_corpus):
    c = committed_corpus
    assert c.gpu.startswith("NVIDIA H100")
    assert len(c.rows) >= 5000
    targets = c.targets()
    assert len(targets) >= 100
    assert {t.dtype for t in targets} == {"fp16", "bf16"}
    assert {t.layout for t in targets} == {"tn", "nn"}
    assert any(r.status != "ok" for r in c.rows), "failures belong in the corpus"
    # every row of a successful candidate has a time and its same-process torch time
    ok = [r for r in c.rows if r.status == "ok"]
    assert all(r.time_us > 0 and r.torch_us > 0 for r in ok)
    assert all(r.code_chars > 1000 for r in c.rows)


def test_held_out_targets_are_measured_densely_and_nowhere_else(committed_corpus):
    held = committed_corpus.by_target("holdout")
    assert len(held) >= 10
    assert all(len(rows) >= 256 for rows in held.values())
    train = set(committed_corpus.targets("train"))
    assert not train & set(held)
    # the shape families of the hold-out report all have targets
    ms = sorted(t.m for t in held)
    assert ms[0] <= 64 and any(64 < m <= 512 for m in ms) and ms[-1] > 512


def test_collect_splits_dedupes_and_scores_against_the_vendor(small_corpus):
    c = small_corpus
    assert set(c.targets("holdout")) == set(SMALL_HOLDOUT)
    keys = [(r.target, r.design.key) for r in c.rows]
    assert len(keys) == len(set(keys))
    raw = [json.loads(x) for x in DEFAULT_DB.read_text().splitlines()]
    raw = [r for r in raw if r.get("record") != "sanitizer_check"]
    vendor = [r for r in raw if r["design"] is None and r["status"] == "ok"]
    assert vendor and c.vendor_speedup
    assert all(s >= 1.0 for s in c.vendor_speedup.values())
    for t, rows in c.by_target().items():
        vl = c.vendor_log(t)
        for r in rows:
            if r.status == "ok":
                # log speedup over the best vendor, less the size (and deviation) penalty
                assert reward(r, vl) < math.log(r.speedup) - vl
                assert reward(r, vl) > math.log(r.speedup) - vl - 0.05
            else:
                assert reward(r, vl) == FAILURE


def test_write_is_atomic_deterministic_and_round_trips(small_corpus, tmp_path):
    a, b = tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"
    write(small_corpus, a)
    write(load(a), b)
    assert a.read_bytes() == b.read_bytes()
    assert load(b).rows == small_corpus.rows
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_inputs_name_the_file_and_line(tmp_path):
    with pytest.raises(CorpusError, match="no such corpus"):
        load(tmp_path / "missing.jsonl.gz")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"target": 1}\nnot json\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:1: not a measurement record"):
        collect([bad])
    old = tmp_path / "old.jsonl.gz"
    with gzip.open(old, "wt") as f:
        f.write(json.dumps({"corpus_schema": 0}) + "\n")
    with pytest.raises(CorpusError, match="corpus_schema 0"):
        load(old)


def test_neighbours_share_dtype_and_layout_and_exclude_the_target(small_corpus):
    t = SMALL_HOLDOUT[0]
    near = neighbours(t, small_corpus.targets(), 3)
    assert len(near) == 3 and t not in near
    assert all((u.dtype, u.layout) == (t.dtype, t.layout) for u in near)
    assert near[0].n == 4096 and near[0].k == 4096


def test_sanitizer_check_lines_are_not_measurements(small_corpus, db_unchecked):
    """The committed database (with the H100's compute-sanitizer check lines) gives the
    corpus it gives without them."""
    assert collect([db_unchecked("default")], SMALL_HOLDOUT).rows == small_corpus.rows
