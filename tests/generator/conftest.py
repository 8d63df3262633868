"""Fixtures of the generator's tests."""

from __future__ import annotations

import pytest

from cudal2.generator.compile import ArtifactCache, build, checked_cubin


@pytest.fixture
def sass_of(tmp_path):
    """``sass_of(design)``: its SASS listing, compiled with nvcc into a fresh artifact cache
    (the compile asserted to succeed without spilling; skips where cuobjdump is not
    installed)."""
    from cudal2.generator import sass

    def listing(d) -> str:
        cache = ArtifactCache(tmp_path)
        r = build(d, cache)
        assert r.ok, r.error
        assert r.spill_bytes == 0
        if sass.tool_dir() is None:
            pytest.skip("cuobjdump not installed")
        return sass.sass(checked_cubin(d, cache), r.symbol)

    return listing
