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


@pytest.fixture
def v5_sass(sass_of):
    """``v5_sass(design)``: the SASS listing of a persistent bulk-store design (sm90tma
    v5's stores), asserted to hold HGMMA of its wgmma N only, the bulk copies (UBLKCP;
    the TMA store's UTMASTG),
    no local memory, and in a PDL design no global access before griddepcontrol.wait
    but the prefetch."""
    import re

    from cudal2.generator import sass
    from cudal2.generator.families import base

    def listing(d) -> str:
        text = sass_of(d)
        assert set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", text)) == {f"64x{d.knobs.wgmma_n}x16"}
        # the bulk copies (UBLKCP), or the TMA store's (UTMASTG, ``store`` = 4, 5)
        copy = "UTMASTG" if d.knobs.as_json().get("store") in (4, 5) else "UBLKCP"
        assert copy in text and "LDL" not in text and "STL" not in text
        trigger = base.pdl_trigger(d)
        if trigger != "none":
            assert sass.pdl_violations(text, trigger) == []
        return text

    return listing
