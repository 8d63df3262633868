"""Benchmark shape files in both formats of bench/shapes/."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal2.shapes import ShapeFileError, load_shapes

SHAPES = Path(__file__).resolve().parents[2] / "bench" / "shapes"


def test_projection_format_expands_tokens_times_projections():
    shapes = load_shapes(SHAPES / "llm-public.toml")
    assert len(shapes) == 48
    assert (1, 6144, 4096) in shapes and (4096, 8192, 3584) in shapes
    assert {m for m, _, _ in shapes} == {1, 16, 64, 256, 1024, 4096}


def test_explicit_format():
    shapes = load_shapes(SHAPES / "cuda-l2-grid-sample.toml")
    assert len(shapes) == 12 and shapes[0] == (64, 64, 64)


def test_repo_copies_match_shared_when_present():
    shared = Path(__file__).resolve().parents[3] / "shared" / "shapes"
    if not shared.exists():
        pytest.skip("the shape lists bench/shapes copies are not in this checkout")
    for f in SHAPES.glob("*.toml"):
        if f.name in SUBSETS:  # the repository's own slice of a shared list
            continue
        assert load_shapes(f) == load_shapes(shared / f.name)


# repository shape files that slice a shared one: (the shared list, the M range kept,
# shapes of the CUDA-L2 grid sample added first)
SUBSETS = {
    "llm-public-decode.toml": ("llm-public.toml", (1, 256), []),
    # issue 22's prefill shapes: llm-public's M >= 1024 and fast.cu's 8192^3 (4096^3 is one)
    "llm-public-prefill.toml": ("llm-public.toml", (1024, 1 << 31), [(8192, 8192, 8192)]),
}


@pytest.mark.parametrize("name", sorted(SUBSETS))
def test_a_slice_is_its_lists_shapes_in_its_m_range(name):
    whole, (lo, hi), extra = SUBSETS[name]
    grid = load_shapes(SHAPES / "cuda-l2-grid-sample.toml")
    assert all(s in grid for s in extra)
    want = extra + [s for s in load_shapes(SHAPES / whole) if lo <= s[0] <= hi]
    assert load_shapes(SHAPES / name) == want and want


@pytest.mark.parametrize(
    "text, needle",
    [
        ("shapes = [[1, 2]]", "shapes[0]"),
        ("shapes = [[1, 0, 3]]", "shapes[0][1] = 0"),
        ("shapes = [[1, true, 3]]", "shapes[0][1] = True"),
        ("tokens = [1]\n[[projection]]\nn = [8]\nk = []", "projection[0]"),
        ("[[projection]]\nn = [8]\nk = [8]", "tokens"),
        ("x = 1", "no shapes"),
        ("shapes = [[1, 2, 3]]\nx = = 1", "line 2"),
    ],
)
def test_bad_files_name_the_key(tmp_path, text, needle):
    f = tmp_path / "s.toml"
    f.write_text(text)
    with pytest.raises(ShapeFileError, match="s.toml") as e:
        load_shapes(f)
    assert needle in str(e.value)
