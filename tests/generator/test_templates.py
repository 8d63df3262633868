"""Templates only substitute: no logic in them (choices live in generator/tags.py),
one definition of each shared helper (in a partial), every partial reachable, and
every partial choice rendering byte for byte what it rendered before templates became
partials (the source is part of the artifact key that recorded measurements name)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from jinja2 import nodes

import cudal2.generator
from cudal2 import __version__
from cudal2.generator import FAMILIES, design_name, tags
from cudal2.generator.render import _env, render
from cudal2.records import KernelDesign, Knobs

TEMPLATES = Path(cudal2.generator.__file__).parent / "templates"
ALL = sorted(str(p.relative_to(TEMPLATES)) for p in TEMPLATES.rglob("*.j2"))

# What a template may hold besides text: substitutions of names and their attributes,
# a tag's str.format, PTX operand numbers (nacc + 1), includes, simple for loops.
_ALLOWED = (
    nodes.Template,
    nodes.Output,
    nodes.TemplateData,
    nodes.Name,
    nodes.Const,
    nodes.Getattr,
    nodes.Getitem,
    nodes.Include,
    nodes.For,
    nodes.Call,
    nodes.Add,
)


def _logic(root: Path, name: str) -> list[str]:
    """Every node of template ``name`` that is more than substitution."""
    tree = _env().parse((root / name).read_text())
    found = []
    for node in tree.find_all(nodes.Node):
        where = f"{name}:{node.lineno}"
        if not isinstance(node, _ALLOWED):
            found.append(f"{where}: {type(node).__name__}")
        elif isinstance(node, nodes.For) and (node.test or node.else_ or node.recursive):
            found.append(f"{where}: a for loop with a filter, an else or recursion")
        elif isinstance(node, nodes.Call) and not (
            isinstance(node.node, nodes.Getattr) and node.node.attr == "format"
        ):
            found.append(f"{where}: a call other than a tag's .format")
    return found


def test_templates_hold_no_logic():
    assert len(ALL) > 50
    assert [f for name in ALL for f in _logic(TEMPLATES, name)] == []


def test_a_template_that_gains_logic_is_caught(tmp_path):
    (tmp_path / "bad.cu.j2").write_text("<% if split_k > 1 %>x<% endif %>{{ a if b }}\n")
    kinds = {f.split(": ")[1] for f in _logic(tmp_path, "bad.cu.j2")}
    assert {"If", "CondExpr"} <= kinds


def _partial_names(value) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(_partial_names(v) for v in value.values()))
    return {value} if isinstance(value, str) and value.endswith(".cu.j2") else set()


def test_every_partial_exists_and_is_reachable():
    chosen = set().union(*(_partial_names(v) for v in vars(tags).values()))
    included = {
        m
        for name in ALL
        for m in re.findall(r'<% include "([^"]+)" %>', (TEMPLATES / name).read_text())
    }
    entries = {fam.TEMPLATE for fam in FAMILIES.values()}
    assert sorted((chosen | included | entries) - set(ALL)) == []  # named but missing
    assert sorted(set(ALL) - chosen - included - entries) == []  # present but unreachable
    assert (TEMPLATES / tags.NONE).read_text() == ""


def _definitions(root: Path, names: list[str]) -> dict[tuple[str, str], list[str]]:
    """(function name, parameter list) -> the templates that define it."""
    out: dict[tuple[str, str], list[str]] = {}
    for name in names:
        text = (root / name).read_text()
        for m in re.finditer(r"__device__\s+__forceinline__\s+[\w:]+\s+(\w+)\(", text):
            depth, i = 1, m.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            params = " ".join(text[m.end() : i - 1].split())
            out.setdefault((m.group(1), params), []).append(name)
    return out


# Helpers more than one family uses (or would), each defined in exactly one partial.
SHARED = {
    "smem_u32": "ptx/smem_u32.cu.j2",
    "cp_async16": "ptx/cp_async16.cu.j2",
    "cp_async_commit": "ptx/cp_async_group.cu.j2",
    "cp_async_wait": "ptx/cp_async_group.cu.j2",
    "ldsm_x4": "ptx/ldmatrix.cu.j2",
    "ldsm_x4_t": "ptx/ldmatrix.cu.j2",
    "ldsm_x2": "ptx/ldmatrix_x2.cu.j2",
    "mbar_init": "ptx/mbarrier.cu.j2",
    "mbar_arrive": "ptx/mbarrier.cu.j2",
    "mbar_arrive_expect_tx": "ptx/mbarrier.cu.j2",
    "mbar_wait": "ptx/mbarrier.cu.j2",
    "mbar_arrive_cluster": "ptx/cluster.cu.j2",
    "cluster_sync": "ptx/cluster.cu.j2",
    "bulk_g2s": "ptx/bulk_copy.cu.j2",
    "tma_load": "ptx/tma_load.cu.j2",
    "tma_load_multicast": "ptx/tma_load_multicast.cu.j2",
    "make_desc": "ptx/wgmma_desc.cu.j2",
    "wgmma_fence": "ptx/wgmma_sync.cu.j2",
}
# mma16816 has two genuinely different overloads: fragment arrays (ldmatrix-fed
# families) and six loose registers (sm90direct's 16-byte global loads).
MMA16816 = {"ptx/mma16816.cu.j2", "ptx/mma16816_regs.cu.j2"}
# Lines of the split-K reduce-and-store epilogue, each in one partial only.
EPILOGUE = {
    "  const int kt_share = (KT + SPLIT_K - 1) / SPLIT_K;\n": "splitk/k_share.cu.j2",
    "  cg::cluster_group cluster = cg::this_cluster();\n  cluster.sync();": (
        "splitk/wait_cluster.cu.j2"
    ),
    "\n    T* dst = C + (long long)m * ldc + n;\n    if (n + 4 <= N": "splitk/store4.cu.j2",
    "  cluster.sync();  // no rank leaves": "splitk/release_cluster.cu.j2",
    "  const int g_end = min(GROUPS, (rank + 1) * PER_RANK);\n": "splitk/reduce_store.cu.j2",
}


def test_each_helper_is_defined_once_and_shared_ones_in_their_partial():
    defs = _definitions(TEMPLATES, ALL)
    assert {k: v for k, v in defs.items() if len(v) > 1} == {}
    by_name: dict[str, set[str]] = {}
    for (fn, _), where in defs.items():
        by_name.setdefault(fn, set()).update(where)
    assert {fn: by_name.get(fn) for fn in SHARED} == {fn: {p} for fn, p in SHARED.items()}
    assert by_name["mma16816"] == MMA16816
    for line, partial in EPILOGUE.items():
        assert [n for n in ALL if line in (TEMPLATES / n).read_text()] == [partial], line


def test_a_copied_helper_is_caught(tmp_path):
    for name in ("a.cu.j2", "b.cu.j2"):
        (tmp_path / name).write_text((TEMPLATES / "ptx/smem_u32.cu.j2").read_text())
    assert list(_definitions(tmp_path, ["a.cu.j2", "b.cu.j2"]).values()) == [["a.cu.j2", "b.cu.j2"]]


# One design per partial choice of each family (greedy cover of the sm_90a spaces) and
# the sha256 prefix of its source (the tool version, the kernel's symbol and the design
# key normalised: they change with the version and the record schema, not with the
# template). The digests were taken from the sources as rendered before templates
# became partials, through the schema-1 -> 2 design mapping. A change here changes the
# design's artifact key: its recorded measurements go stale and must be re-measured.
GOLDEN = [
    ("sm80mma", "fp16", "tn", dict(bm=16, bn=32, bk=32, warps_m=1, warps_n=1, warps_k=1, stages=2),
     "d33b7980c96f9942"),
    ("sm80mma", "bf16", "nn", dict(bm=16, bn=32, bk=32, warps_m=1, warps_n=1, warps_k=1, stages=2),
     "140ce058fc46718c"),
    ("sm90csk", "fp16", "tn", dict(bm=16, bn=32, bk=64, warps_m=1, warps_n=1, stages=2, split_k=2),
     "8924bf29953e9ba9"),
    ("sm90csk", "bf16", "nn", dict(bm=16, bn=32, bk=64, warps_m=1, warps_n=1, stages=2, split_k=2),
     "b8ba9774f238d26f"),
    ("sm90direct", "fp16", "tn", dict(bm=8, warps_n=1, warps_k=1, bk=64, stages=3, split_k=1),
     "adb981cd6e221caf"),
    ("sm90direct", "bf16", "tn", dict(bm=8, warps_n=1, warps_k=1, bk=64, stages=2, split_k=2),
     "80a58a376a45230e"),
    ("sm90stream", "fp16", "tn",
     dict(bm=8, bn=32, bk=64, warps_m=1, warps_n=1, stages=3, split_k=1), "a35bfc102e0c45e1"),
    ("sm90stream", "bf16", "nn",
     dict(bm=8, bn=32, bk=64, warps_m=1, warps_n=1, stages=3, split_k=2), "9a9b438245d2408d"),
    ("sm90tma", "fp16", "tn", dict(swap=0, warpgroups=1, m_blocks=1, wgmma_n=64, stages=4,
     split_k=2, persistent=0, cluster_m=1), "04159a89f93580a9"),
    ("sm90tma", "fp16", "tn", dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=64, stages=4,
     split_k=1, persistent=0, cluster_m=2), "71c3f41438ffa84a"),
    ("sm90tma", "fp16", "tn", dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=128, stages=4,
     split_k=1, persistent=1, cluster_m=1), "42441693d8576fdb"),
    ("sm90tma", "bf16", "tn", dict(swap=0, warpgroups=2, m_blocks=1, wgmma_n=128, stages=4,
     split_k=1, persistent=2, cluster_m=1), "f764f2d0801dd9b8"),
    ("sm90wgmma", "fp16", "tn", dict(warpgroups=1, bn=64, stages=3), "23ebafd9a2fd1827"),
    ("sm90wgmma", "bf16", "tn", dict(warpgroups=1, bn=64, stages=3), "53109e972e812fb7"),
    # added with the RMSNorm row scale (issue 20): a multicast pair of 32-row tiles
    ("sm90tma", "fp16", "tn", dict(swap=1, warpgroups=1, m_blocks=1, wgmma_n=32, stages=4,
     split_k=1, persistent=0, cluster_m=2), "25847726808e3c6c"),
]  # fmt: skip


def _golden_design(args) -> KernelDesign:
    family, dtype, layout, knobs, _ = args
    return KernelDesign(family, "sm_90a", dtype, layout, Knobs.of(**knobs))


@pytest.mark.parametrize("args", GOLDEN, ids=[a[0] for a in GOLDEN])
def test_rendered_source_is_unchanged(args):
    d = _golden_design(args)
    src = render(d).replace(f"cudal2 {__version__} ", "cudal2 VERSION ")
    src = src.replace(design_name(d), "<symbol>").replace(d.key, "<design key>")
    assert hashlib.sha256(src.encode()).hexdigest()[:16] == args[-1], design_name(d)


# PDL designs of golden tiles (GOLDEN index, trigger) and their digests, taken when PDL
# was added (issue 20): every PDL partial is reached, and a change to one shows here.
GOLDEN_PDL = [
    (4, "entry", "0498bd1db264ccf5"),
    (7, "before_epilogue", "6da3cce949c26530"),
    (9, "after_mainloop", "427d9f2cd00c1cf1"),
    (10, "entry", "0fe26112435d4980"),
    (11, "before_epilogue", "fb50f8eca23d050a"),
    (0, "after_mainloop", "f966d08412215446"),
    (3, "entry", "3232ca44b433b181"),
    (12, "before_epilogue", "73e00217d40c9501"),
]


def _golden_pdl(i: int, trigger: str) -> KernelDesign:
    from cudal2.generator.families.base import with_pdl

    return with_pdl(_golden_design(GOLDEN[i]), trigger)


@pytest.mark.parametrize("i, trigger, digest", GOLDEN_PDL)
def test_rendered_pdl_source_is_unchanged(i, trigger, digest):
    d = _golden_pdl(i, trigger)
    src = render(d).replace(f"cudal2 {__version__} ", "cudal2 VERSION ")
    src = src.replace(design_name(d), "<symbol>").replace(d.key, "<design key>")
    assert hashlib.sha256(src.encode()).hexdigest()[:16] == digest, design_name(d)


# Fused-epilogue designs of golden tiles (GOLDEN index, epilogue, PDL trigger)
# and their digests, taken when epilogues were added (issue 20): every epilogue
# partial is reached (the one-tile and the persistent kernel), and a change shows here.
GOLDEN_EPILOGUE = [
    (8, "bias_residual", "none", "d176ed91099880b2"),
    (10, "bias_residual", "entry", "ed16d73a90fa186e"),
    (11, "residual", "none", "0f8793577e3d7d63"),
    (9, "bias", "before_epilogue", "ccf215552d9a799a"),
    # the gated activation and RMSNorm row scale (one-tile kernel only), their digests
    # taken when they were added
    (8, "rmsnorm_silu", "entry", "1a4a0dcfbc840a5c"),
    (9, "gelu_tanh", "none", "0c5b521670d4c386"),
    (8, "rmsnorm_bias", "after_mainloop", "cb4b0fb95b5ccd66"),
    (14, "rmsnorm_gelu_tanh", "entry", "fd375023a59c63f9"),
    # sm90direct (stages 3 split 1, stages 2 split 2) and sm90stream, every epilogue
    # partial of the split-K families reached, their digests taken when they were added
    (4, "rmsnorm_bias", "entry", "c84e624c65f8c07e"),
    (5, "rmsnorm_silu", "none", "13c0c588935c15af"),
    (6, "rmsnorm_gelu_tanh", "before_epilogue", "609f7ce9aa1f1501"),
    (5, "bias_residual", "after_mainloop", "eceea1d247a69e43"),
    (6, "residual", "none", "6024ae3ad4a94a42"),
    (4, "gelu_tanh", "none", "d509bf9370d2a59b"),
    # RoPE and the KV-cache write (sm90direct), their digests taken when they were added
    (4, "rmsnorm_rope_kv", "before_epilogue", "1dd21644d15baba2"),
    (5, "rmsnorm_bias_rope_kv", "none", "629a436246382cd3"),
]


def _golden_epilogue(i: int, epilogue: str, trigger: str) -> KernelDesign:
    from cudal2.generator.families.base import with_epilogue, with_pdl

    return with_pdl(with_epilogue(_golden_design(GOLDEN[i]), epilogue), trigger)


@pytest.mark.parametrize("i, epilogue, trigger, digest", GOLDEN_EPILOGUE)
def test_rendered_epilogue_source_is_unchanged(i, epilogue, trigger, digest):
    d = _golden_epilogue(i, epilogue, trigger)
    src = render(d).replace(f"cudal2 {__version__} ", "cudal2 VERSION ")
    src = src.replace(design_name(d), "<symbol>").replace(d.key, "<design key>")
    assert hashlib.sha256(src.encode()).hexdigest()[:16] == digest, design_name(d)


# sm90tma v5 (issue 22) designs (persistent cooperative compute-orientation knobs as
# sm90_tma.design takes them) and their digests, taken when v5 was added: the grouped
# walk, the bulk store, both.
GOLDEN_V5 = [
    ("fp16", dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8),
     "474ed94289978ea0"),
    ("bf16", dict(wgs=2, mp=1, swap=False, n=256, stages=3, split=1, pers=1, store=1),
     "c6905f0cd7399df5"),
    ("fp16", dict(wgs=2, mp=1, swap=False, n=256, stages=3, split=1, pers=1, raster=16,
                  store=1), "6f3b3ae500a39f60"),
    # the persistent multicast pair (issue 22's second slice)
    ("fp16", dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, cluster=2),
     "119a2c71dcc87371"),
    ("bf16", dict(wgs=2, mp=1, swap=False, n=256, stages=3, split=1, pers=1, cluster=2,
                  raster=8, ctas=128, store=1), "9f5d44be7fa34113"),
    # ping-pong with the bulk store, each warpgroup through its own C buffer half (issue
    # 22's fourth slice): 128x128 with the walk and the cap; 64x224
    ("fp16", dict(wgs=2, mp=2, swap=False, n=128, stages=4, split=1, pers=2, raster=8,
                  ctas=128, store=1), "7b7f6498b7cec154"),
    ("bf16", dict(wgs=2, mp=1, swap=False, n=224, stages=4, split=1, pers=2, store=1),
     "f5bfcca6ede8553a"),
    # v5 overlap (its own kernel: two accumulator sets) and v5 halves (the half C buffer)
    ("fp16", dict(wgs=2, mp=1, swap=False, n=192, stages=4, split=1, pers=1, raster=8,
                  ctas=128, store=2), "1178724d1be5f930"),
    ("bf16", dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=16,
                  store=3), "0b11948fee88325a"),
    # the v5 TMA store (subtiles by TMA through a tensor map of C)
    ("fp16", dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8,
                  ctas=128, store=4), "a4dc7a6059f7770f"),
    # the v5 ring counter (the ring's slot and phase as counters), ping-pong 128x112
    ("fp16", dict(wgs=2, mp=2, swap=False, n=112, stages=6, split=1, pers=2, raster=8,
                  store=4, ring=1), "4ff8cfdb7d7171b1"),
    # the v5 ping-pong pair (the ping-pong kernel multicasting B in clusters of two)
    ("fp16", dict(wgs=2, mp=2, swap=False, n=128, stages=6, split=1, pers=2, cluster=2,
                  raster=8, ctas=128, store=4, ring=1, uniform=1), "c7153a99689e9bd3"),
    # the v5 uniform warpgroup index (broadcast from lane 0), cooperative 128x256
    ("bf16", dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8,
                  ctas=128, store=4, uniform=1), "b8b2010405553ad7"),
    # the v5 gated TMA store (a gated activation's outputs through C's map of N / 2); its
    # digest retaken (2026-12-05) when it took the fast activations (tags.TMA_FAST_ACT),
    # and a GeLU one added then
    ("fp16", dict(wgs=2, mp=2, swap=False, n=128, stages=6, split=1, pers=2, raster=8,
                  ctas=128, store=4, ring=1, epilogue="silu"), "b1ceb748de17f206"),
    ("bf16", dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8,
                  ctas=128, store=4, epilogue="gelu_tanh"), "353e6798cc891910"),
    # v5 R by TMA (R's subtiles by TMA into the store's buffers, read back with ldmatrix),
    # cooperative 128x256 and ping-pong 128x128
    ("fp16", dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8,
                  ctas=128, store=4, rtma=1, epilogue="residual"), "3da1c1a162dc1a8f"),
    ("bf16", dict(wgs=2, mp=2, swap=False, n=128, stages=6, split=1, pers=2, raster=8,
                  store=4, ring=1, rtma=1, epilogue="bias_residual"), "db5ab8e5a51dcb35"),
    # v5 row scale (the producer warpgroup's helper warps hand each tile's row scales to
    # the consumers): cooperative 128x256 gated, 128x128 with the bias and the counters
    ("fp16", dict(wgs=2, mp=1, swap=False, n=256, stages=4, split=1, pers=1, raster=8,
                  ctas=128, store=4, epilogue="rmsnorm_silu"), "341e9b97dfe4da12"),
    ("bf16", dict(wgs=2, mp=1, swap=False, n=128, stages=5, split=1, pers=1, raster=8,
                  ctas=128, store=4, ring=1, uniform=1, epilogue="rmsnorm_bias"),
     "0412b2afd3b6d9e4"),
    # v5 stream-K (the last tiles cut along K, their pieces' sums through the workspace):
    # cooperative 128x256 plain, 128x192 gated, 128x128 with the bias and residual and counters
    ("fp16", dict(wgs=2, mp=1, swap=False, n=256, stages=3, split=1, pers=1, raster=8,
                  store=4, uniform=1, streamk=1), "cb10fdedb7c41142"),
    ("bf16", dict(wgs=2, mp=1, swap=False, n=128, stages=6, split=1, pers=1, raster=8,
                  store=4, ring=1, uniform=1, streamk=1, epilogue="bias_residual"),
     "036b9088d734c38a"),
    ("fp16", dict(wgs=2, mp=1, swap=False, n=192, stages=4, split=1, pers=1, raster=8,
                  store=4, uniform=1, streamk=1, epilogue="silu"), "1bcd3215abad5499"),
]  # fmt: skip


def _golden_v5(dtype: str, knobs: dict) -> KernelDesign:
    from cudal2.generator.families import sm90_tma
    from cudal2.generator.families.base import with_epilogue

    knobs = dict(knobs)
    epilogue = knobs.pop("epilogue", "none")
    return with_epilogue(sm90_tma.design(dtype, **knobs), epilogue)


@pytest.mark.parametrize("dtype, knobs, digest", GOLDEN_V5)
def test_rendered_v5_source_is_unchanged(dtype, knobs, digest):
    d = _golden_v5(dtype, knobs)
    src = render(d).replace(f"cudal2 {__version__} ", "cudal2 VERSION ")
    src = src.replace(design_name(d), "<symbol>").replace(d.key, "<design key>")
    assert hashlib.sha256(src.encode()).hexdigest()[:16] == digest, design_name(d)


def test_golden_designs_use_every_template(monkeypatch):
    env, used = _env(), set()
    for method in ("get_template", "get_or_select_template"):
        original = getattr(env, method)

        def tracking(name, *a, _original=original, **k):
            used.add(name)
            return _original(name, *a, **k)

        monkeypatch.setattr(env, method, tracking)
    for args in GOLDEN:
        render(_golden_design(args))
    for i, trigger, _ in GOLDEN_PDL:
        render(_golden_pdl(i, trigger))
    for i, epilogue, trigger, _ in GOLDEN_EPILOGUE:
        render(_golden_epilogue(i, epilogue, trigger))
    for dtype, knobs, _ in GOLDEN_V5:
        render(_golden_v5(dtype, knobs))
    assert sorted(set(ALL) - used) == []
