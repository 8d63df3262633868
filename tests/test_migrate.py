"""Schema 1 -> 2: the mapping of old (flat) designs to family knobs, the committed
artifact mapping (checked against today's code: the new design keys, the rendered
artifact keys and, for one design of each family, the compiled SASS), and every
committed record still loading."""

from __future__ import annotations

import gzip
import json
import shutil
import warnings
from collections import Counter
from pathlib import Path

import pytest

from cudal2.database import MeasurementDB
from cudal2.generator import FAMILIES, launch_recipe, legality
from cudal2.generator.compile import ArtifactCache, artifact_key_of, build
from cudal2.migrate import (
    Mapping,
    NotMappable,
    design_of,
    migrate_record,
    old_design_key,
    read_lines,
)

ROOT = Path(__file__).resolve().parents[1]
MAPPING = ROOT / "bench" / "results" / "migration-schema2.json.gz"
DATABASES = sorted(
    [*ROOT.glob("manifests/*.measurements.jsonl"), *ROOT.glob("bench/results/*.measurements.*")]
)
CORPORA = sorted(ROOT.glob("policy/data/*corpus.jsonl.gz"))


def _old(family, bm, bn, bk, warps_m, warps_n, stages, **kw):
    return {
        "family": family, "arch": "sm_90a", "dtype": "fp16", "layout": "tn",
        "bm": bm, "bn": bn, "bk": bk, "warps_m": warps_m, "warps_n": warps_n, "stages": stages,
        "warps_k": 1, "split_k": 1, "cluster_m": 1, "cluster_n": 1, "swizzle": 1, **kw,
    }  # fmt: skip


# (old schema-1 design, its schema-2 knobs, tile (bm, bn) of the recipe)
CASES = [
    (_old("sm80mma", 128, 128, 32, 2, 2, 4, warps_k=2),
     dict(bm=128, bn=128, bk=32, warps_m=2, warps_n=2, warps_k=2, stages=4), (128, 128)),
    (_old("sm90csk", 16, 64, 128, 1, 2, 4, split_k=8),
     dict(bm=16, bn=64, bk=128, warps_m=1, warps_n=2, stages=4, split_k=8), (16, 64)),
    (_old("sm90stream", 8, 64, 128, 1, 4, 8, split_k=2),
     dict(bm=8, bn=64, bk=128, warps_m=1, warps_n=4, stages=8, split_k=2), (8, 64)),
    (_old("sm90direct", 16, 64, 128, 1, 4, 3, warps_k=2, split_k=4),
     dict(bm=16, warps_n=4, warps_k=2, bk=128, stages=3, split_k=4), (16, 64)),
    (_old("sm90wgmma", 128, 256, 64, 8, 1, 3),
     dict(warpgroups=2, bn=256, stages=3), (128, 256)),
    (_old("sm90tma", 128, 256, 64, 8, 1, 4),
     dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=256, stages=4, split_k=1, persistent=0,
          cluster_m=1), (128, 256)),
    (_old("sm90tma", 16, 256, 64, 1, 8, 4, split_k=4),
     dict(swap=1, warpgroups=2, m_blocks=2, wgmma_n=16, stages=4, split_k=4, persistent=0,
          cluster_m=1), (16, 256)),
    (_old("sm90tma", 128, 160, 64, 8, 1, 6, persistent=2),
     dict(swap=0, warpgroups=2, m_blocks=2, wgmma_n=160, stages=6, split_k=1, persistent=2,
          cluster_m=1), (128, 160)),
    (_old("sm90tma", 128, 128, 64, 8, 1, 4, cluster_m=2),
     dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=128, stages=4, split_k=1, persistent=0,
          cluster_m=2), (128, 128)),
]  # fmt: skip

# (old design, what makes it unmappable)
UNMAPPABLE = [
    (_old("sm80mma", 128, 128, 32, 2, 2, 4, split_k=2), "split_k"),
    (_old("sm90direct", 16, 48, 128, 1, 4, 2), "bn"),
    (_old("sm90tma", 128, 128, 64, 2, 2, 4), "orientation"),
    (_old("sm90wgmma", 64, 128, 64, 2, 1, 3), "bm"),
    (_old("nosuch", 64, 128, 64, 2, 1, 3), "unknown family"),
    ({**_old("sm80mma", 64, 64, 32, 2, 2, 3), "unroll": 2}, "unknown schema-1"),
]


@pytest.mark.parametrize(("old", "knobs", "tile"), CASES, ids=[c[0]["family"] for c in CASES])
def test_old_designs_map_to_their_family_knobs(old, knobs, tile):
    d = design_of(old)
    assert d.family == old["family"] and d.knobs.as_json() == knobs
    assert legality(d) == []
    r = launch_recipe(d)
    assert (r["tile_m"], r["tile_n"]) == tile
    assert r["split_k"] == old["split_k"] and r["cluster"][1] == old["cluster_m"]


@pytest.mark.parametrize(("old", "why"), UNMAPPABLE, ids=[u[1] for u in UNMAPPABLE])
def test_designs_with_no_counterpart_are_refused(old, why):
    with pytest.raises(NotMappable, match=why):
        design_of(old)


def test_every_family_has_a_mapping_case():
    assert {c[0]["family"] for c in CASES} == set(FAMILIES)


@pytest.fixture(scope="module")
def mapping() -> Mapping:
    if not MAPPING.exists():
        pytest.fail(f"{MAPPING} is missing")
    return Mapping.load(MAPPING)


def test_the_mapping_agrees_with_todays_code(mapping):
    """Each entry's new design key is today's key of the mapped design, and each mapped
    artifact key is what that design renders to today (no template change since)."""
    counts: Counter[str] = Counter()
    for key, e in mapping.entries.items():
        assert old_design_key(e["old_design"]) == key
        d = design_of(e["old_design"])
        assert d.key == e["new_design_key"]
        if e["new_artifact_key"]:
            assert artifact_key_of(d) == e["new_artifact_key"], key
        counts[e["unmatched"] or "mapped"] += 1
    assert counts["mapped"] > 0.85 * sum(counts.values()), counts


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_one_mapped_design_per_family_compiles_to_the_recorded_sass(mapping, tmp_path):
    """The mapping was accepted where the old and new cubins' SASS matched; today's
    compile of one design per family still gives that SASS."""
    sass = pytest.importorskip("cudal2.generator.sass")
    if sass.tool_dir() is None:
        pytest.skip("cuobjdump/nvdisasm not installed")
    picked = {}
    for e in sorted(mapping.entries.values(), key=lambda e: e["old_design_key"]):
        if e["new_artifact_key"]:
            picked.setdefault(e["old_design"]["family"], e)
    assert set(picked) == set(FAMILIES)
    cache = ArtifactCache(tmp_path)
    for e in picked.values():
        b = build(design_of(e["old_design"]), cache)
        assert b.ok and b.artifact_key == e["new_artifact_key"]
        assert sass.sass_sha256(cache.cubin(b.artifact_key), b.symbol) == e["sass_sha256"]


def test_a_record_is_rewritten_with_the_mapped_keys(mapping):
    e = next(e for e in mapping.entries.values() if e["new_artifact_key"])
    rec = {
        "schema_version": 1,
        "design": e["old_design"],
        "design_key": e["old_design_key"],
        "artifact_key": e["old_artifact_key"],
        "status": "ok",
    }
    why: Counter[str] = Counter()
    out = migrate_record(rec, mapping, why)
    assert out["design_key"] == e["new_design_key"] and out["schema_version"] == 2
    assert out["artifact_key"] == e["new_artifact_key"] and why["artifact mapped"] == 1
    # An artifact the mapping does not know (an older template) is kept, and said so.
    stale = migrate_record({**rec, "artifact_key": "0" * 64}, mapping, why)
    assert stale["artifact_key"] == "0" * 64 and stale["design_key"] == e["new_design_key"]
    assert any(k.startswith("artifact kept") for k in why)
    # Without a mapping only the design moves.
    bare = migrate_record(rec, None, why)
    assert bare["artifact_key"] == e["old_artifact_key"]


@pytest.mark.parametrize("path", DATABASES, ids=lambda p: p.name)
def test_every_committed_record_loads(path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a skipped (unreadable) line warns
        contents = MeasurementDB(path).load()
    ms = contents.measurements
    lines = sum(1 for _ in read_lines(path))
    checks = [c for c in contents.checks if c.check]  # lines of their own (not legacy)
    assert len(ms) + len(checks) == lines > 0 and contents.skipped == ()
    assert all(m.schema_version == 2 for m in ms)


@pytest.mark.parametrize("path", CORPORA, ids=lambda p: p.name)
def test_every_corpus_row_is_schema_2(path):
    with gzip.open(path, "rt") as f:
        header, *rows = [json.loads(line) for line in f]
    assert "corpus_schema" in header
    assert rows and all("knobs" in r["design"] for r in rows)
