"""Programmatic dependent launch in every family: the optional ``pdl_trigger`` knob
(left out at its default, so no existing design's key, name, recipe or source moves),
the recipe's ``pdl``, the rendered PDL code, and (with nvcc) the SASS order: the wait
(ACQBULK) before every global load or store, the trigger (PREEXIT) where the knob puts
it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cudal2.generator import FAMILIES, design_name, design_space, launch_recipe, legality
from cudal2.generator import sass as sass_mod
from cudal2.generator.compile import BASE_FLAGS, arch_flags
from cudal2.generator.families import base
from cudal2.generator.render import render, symbol
from cudal2.generator.space import pdl_variants
from cudal2.records import KernelDesign, Knobs

TRIGGERS = [t for t in base.PDL_TRIGGERS if t != "none"]


def _first(family: str, layout: str = "tn", **knobs: int) -> KernelDesign:
    """The first design of ``family``'s space with these knob values."""
    return next(
        d
        for d in design_space("sm_90a", "fp16", layout, [family])
        if all(getattr(d.knobs, k) == v for k, v in knobs.items())
    )


# One design per kernel (and per layout where the B slice is spelled per layout).
SAMPLE = [
    ("sm80mma", "tn", {}),
    ("sm80mma", "nn", {"warps_k": 2}),
    ("sm90csk", "tn", {"split_k": 4}),
    ("sm90csk", "nn", {}),
    ("sm90direct", "tn", {"stages": 2, "split_k": 2}),
    ("sm90direct", "tn", {"stages": 3}),
    ("sm90stream", "tn", {"split_k": 2}),
    ("sm90stream", "nn", {}),
    ("sm90tma", "tn", {"persistent": 0, "split_k": 2}),
    ("sm90tma", "tn", {"persistent": 0, "cluster_m": 2}),
    ("sm90tma", "tn", {"persistent": 1}),
    ("sm90tma", "tn", {"persistent": 2}),
    ("sm90wgmma", "tn", {}),
]


def test_the_sample_covers_every_family():
    assert {f for f, _, _ in SAMPLE} == set(FAMILIES)


def test_a_plain_design_keeps_its_key_name_and_recipe():
    for family, layout, knobs in SAMPLE:
        d = _first(family, layout, **knobs)
        assert base.pdl_trigger(d) == "none" and "pdl_trigger" not in d.knobs.names()
        assert base.with_pdl(d, "none") == d
        assert base.make(family, "sm_90a", "fp16", layout, **d.knobs.as_json(), pdl_trigger=0) == d
        assert "pdl" not in launch_recipe(d)
        assert "pdl" not in design_name(d)


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_a_pdl_design_is_legal_named_and_launched_with_pdl(trigger):
    for family, layout, knobs in SAMPLE:
        d = _first(family, layout, **knobs)
        p = base.with_pdl(d, trigger)
        assert legality(p) == [] and base.pdl_trigger(p) == trigger and p.key != d.key
        word = {"entry": "entry", "after_mainloop": "mainloop", "before_epilogue": "epilogue"}
        assert design_name(p) == f"{design_name(d)}_pdl_{word[trigger]}"
        assert launch_recipe(p) == {**launch_recipe(d), "pdl": True}
        assert base.with_pdl(p, "none") == d


# Hostile knob values: every one refused with its reason.
@pytest.mark.parametrize(
    "value, needle",
    [(0, "is the default: leave it out"), (4, "pdl_trigger=4 is not one of"), (-1, "not one of")],
)
def test_a_bad_pdl_trigger_is_illegal(value, needle):
    d = _first("sm90direct")
    bad = KernelDesign(d.family, d.arch, d.dtype, d.layout, Knobs.of(**d.knobs.as_json(),
                       pdl_trigger=value))  # fmt: skip
    assert any(needle in r for r in legality(bad)), legality(bad)


def test_an_unknown_trigger_name_is_refused():
    with pytest.raises(ValueError, match="pdl trigger 'exit' is not one of"):
        base.with_pdl(_first("sm90wgmma"), "exit")


def test_the_space_offers_pdl_variants_only_when_asked():
    plain = design_space("sm_90a", "fp16", "tn", ["sm90wgmma"])
    with_pdl = design_space("sm_90a", "fp16", "tn", ["sm90wgmma"], pdl=True)
    assert all(base.pdl_trigger(d) == "none" for d in plain)
    assert len(with_pdl) == 4 * len(plain)
    assert [d for d in with_pdl if base.pdl_trigger(d) == "none"] == plain
    assert len({d.key for d in with_pdl}) == len(with_pdl)
    assert [base.pdl_trigger(p) for p in pdl_variants(plain[0])] == TRIGGERS


def test_the_policy_and_cost_model_see_a_pdl_design_as_its_tile():
    """The policy's vocabulary (and its trained checkpoints) are unchanged: a PDL design
    is spelled by its family's required knobs, as its plain design is."""
    from cudal2.policy.cost_model import predicted_time_s
    from cudal2.policy.tokens import design_tokens
    from cudal2.records import Target

    d = _first("sm90direct")
    p = base.with_pdl(d, "entry")
    assert design_tokens(p) == design_tokens(d)
    t = Target("sm_90a", "fp16", "tn", 16, 4096, 4096)
    assert predicted_time_s(p, t) == predicted_time_s(d, t) > 0  # the cost model sees the tile


def _order(src: str, *needles: str) -> list[int]:
    return [src.index(n) for n in needles]


@pytest.mark.parametrize("trigger", TRIGGERS)
@pytest.mark.parametrize("case", SAMPLE, ids=[f"{f}-{lay}-{k}" for f, lay, k in SAMPLE])
def test_the_source_waits_before_it_touches_a_or_c(case, trigger):
    family, layout, knobs = case
    d = _first(family, layout, **knobs)
    plain, src = render(d), render(base.with_pdl(d, trigger))
    assert "griddepcontrol" not in plain and "pdl_" not in plain
    body = src[src.index('extern "C" __global__') :]
    assert body.count("pdl_wait();") == 1 and body.count("pdl_launch_dependents();") == 1
    assert body.count("pdl_prefetch_l2(") == 1
    wait, trig = _order(body, "pdl_wait();", "pdl_launch_dependents();")
    assert body.index("pdl_prefetch_l2(") < wait
    assert (trig < wait) == (trigger == "entry")


def _compiled_sass(d: KernelDesign, tmp_path) -> str:
    cu, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    cu.write_text(render(d))
    cmd = ["nvcc", *BASE_FLAGS, *arch_flags(d.arch), "-o", str(cubin), str(cu)]
    subprocess.run(cmd, check=True, capture_output=True)
    return sass_mod.sass(cubin.read_bytes(), symbol(d))


# A sample (compiles cost ~0.5 s each): every kernel once, the triggers rotated.
COMPILED = [(case, TRIGGERS[i % len(TRIGGERS)]) for i, case in enumerate(SAMPLE)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.skipif(sass_mod.tool_dir() is None, reason="needs cuobjdump")
@pytest.mark.parametrize(
    "case, trigger", COMPILED, ids=[f"{c[0]}-{c[1]}-{c[2]}-{t}" for c, t in COMPILED]
)
def test_sass_waits_before_every_global_access(case, trigger, tmp_path):
    family, layout, knobs = case
    p = base.with_pdl(_first(family, layout, **knobs), trigger)
    listing = _compiled_sass(p, tmp_path)
    assert sass_mod.pdl_violations(listing, trigger) == []
    ops = {op for _, op in sass_mod.opcodes(listing)}
    assert "CCTL" in ops  # the L2 prefetch of B, before the wait


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.skipif(sass_mod.tool_dir() is None, reason="needs cuobjdump")
def test_a_plain_design_has_no_griddepcontrol_in_sass(tmp_path):
    listing = _compiled_sass(_first("sm90direct"), tmp_path)
    assert sass_mod.pdl_violations(listing, "none") == []


_L = "        /*{:04x}*/                   {} ;"


def _listing(*ops: str) -> str:
    return "\n".join(_L.format(16 * i, op) for i, op in enumerate(ops))


# Hostile SASS listings: what pdl_violations must report.
@pytest.mark.parametrize(
    "ops, trigger, needle",
    [
        (("PREEXIT", "LDG.E.128 R4, desc[UR4][R2.64]", "ACQBULK"), "entry", "LDG at 0x0010"),
        (("PREEXIT", "@P0 STG.E [R2.64], R4", "ACQBULK"), "entry", "STG at 0x0010"),
        (("UTMALDG.2D [UR8], [UR4]", "ACQBULK", "PREEXIT"), "after_mainloop", "UTMALDG at"),
        (("LDGSTS.E.128 [R1], desc[UR4][R2.64]", "ACQBULK", "PREEXIT"), "before_epilogue",
         "LDGSTS at"),
        (("PREEXIT", "LDG.E R4, desc[UR4][R2.64]"), "entry", "no ACQBULK"),
        (("ACQBULK", "LDG.E R4, desc[UR4][R2.64]"), "entry", "no PREEXIT"),
        (("ACQBULK", "PREEXIT"), "entry", "PREEXIT is not before ACQBULK"),
        (("PREEXIT", "ACQBULK"), "before_epilogue", "PREEXIT is not after ACQBULK"),
        (("ACQBULK", "LDG.E R4, desc[UR4][R2.64]"), "none", "ACQBULK in a plain design"),
    ],
)  # fmt: skip
def test_sass_violations_are_reported(ops, trigger, needle):
    found = sass_mod.pdl_violations(_listing(*ops), trigger)
    assert any(needle in v for v in found), found


def test_a_good_listing_has_no_violations():
    ok = _listing("CCTL.E.PF2 [R2]", "PREEXIT", "ACQBULK", "LDG.E R4, desc[UR4][R2.64]", "STG.E")
    assert sass_mod.pdl_violations(ok, "entry") == []
