"""What a kernel family declares, and the checks every family shares.

A family is a module of ``cudal2.generator.families`` holding:

- ``FAMILY`` (its name), ``TEMPLATE`` (its jinja2 template), ``ARCHS``, ``LAYOUTS``;
- ``KNOBS``: its own knobs, in the order its designs' names print them (``Knob``);
- ``rules(d) -> list[str]``: legality beyond the declared checks (cross-knob rules,
  shared memory, registers), every reason;
- ``space(arch, dtype, layout) -> list[KernelDesign]``: its enumerated designs;
- ``launch_recipe(d) -> dict`` (the ABI's launch recipe), ``template_context(d) ->
  dict`` (what its template substitutes) and ``features(d) -> Features`` (what the
  cost model and the proposers see of a design, whatever its family).

Nothing outside the family branches on its name: legality, names, recipes, template
contexts, cost-model features and the policy's tokens all come from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from cudal2.records import DTYPES, EPILOGUES, KernelDesign, Knobs


@dataclass(frozen=True)
class Knob:
    """One knob of a family: its name, every value it may take, and how it prints in a
    design's name (a format with one ``{}``; a label that starts with ``x`` continues
    the previous part, as in ``128x64``)."""

    name: str
    domain: tuple[int, ...]
    label: str
    # An optional knob (``default`` set) is left out of a design at its default value,
    # so adding one changes no existing design's key, name or source. ``spellings``
    # names its values in the design's name (value -> word).
    default: int | None = None
    spellings: tuple[tuple[int, str], ...] = ()

    def spell(self, value: int) -> str:
        """The knob's part of a design's name."""
        return self.label.format(dict(self.spellings).get(value, value))


# Programmatic dependent launch (PDL): where the kernel issues
# ``griddepcontrol.launch_dependents``. 0 (``none``, the default, left out of the
# design) is not a PDL design: no griddepcontrol at all. Every PDL design waits
# (``griddepcontrol.wait``) before it reads A or writes C; the trigger point is the
# knob. Every family accepts it (``SHARED_KNOBS``); docs/kernels.md, "Programmatic
# dependent launch".
PDL_TRIGGERS: tuple[str, ...] = ("none", "entry", "after_mainloop", "before_epilogue")
PDL_TRIGGER = Knob(
    "pdl_trigger",
    tuple(range(len(PDL_TRIGGERS))),
    "pdl_{}",
    default=0,
    spellings=((1, "entry"), (2, "mainloop"), (3, "epilogue")),
)
# The fused epilogue the kernel renders (an index into ``records.EPILOGUES``): what it
# adds to the fp32 accumulator before the single rounding to the output dtype. 0
# (``none``, the default, left out of the design) is a plain GEMM. Every family declares
# which it renders (``EPILOGUES`` in its module, ``("none",)`` where it has none): the
# knob is shared so that every family's names and checks treat it alike, but only a
# family that renders an epilogue accepts a value other than ``none``. A design with an
# epilogue serves only targets with that epilogue (``for_target``).
EPILOGUE = Knob(
    "epilogue",
    tuple(range(len(EPILOGUES))),
    "epi_{}",
    default=0,
    spellings=tuple((i, e) for i, e in enumerate(EPILOGUES) if e != "none"),
)
# Optional knobs every family takes, after its own in a design's name. Not in a
# family's ``KNOBS`` (its required knobs, which the policy's tokens spell).
SHARED_KNOBS: tuple[Knob, ...] = (PDL_TRIGGER, EPILOGUE)


def optional_value(d: KernelDesign, knob: Knob) -> int:
    """An optional knob's value in ``d`` (its default where the design leaves it out)."""
    assert knob.default is not None, knob.name
    return d.knobs.as_json().get(knob.name, knob.default)


def pdl_trigger(d: KernelDesign) -> str:
    """The design's PDL trigger point by name (``none``: not a PDL design)."""
    return PDL_TRIGGERS[optional_value(d, PDL_TRIGGER)]


def with_pdl(d: KernelDesign, trigger: str) -> KernelDesign:
    """``d`` with PDL trigger ``trigger`` (one of ``PDL_TRIGGERS``; ``none`` removes the
    knob, giving back the plain design and its key)."""
    if trigger not in PDL_TRIGGERS:
        raise ValueError(f"pdl trigger {trigger!r} is not one of {PDL_TRIGGERS}")
    knobs = {k: v for k, v in d.knobs.as_json().items() if k != PDL_TRIGGER.name}
    if trigger != "none":
        knobs[PDL_TRIGGER.name] = PDL_TRIGGERS.index(trigger)
    return KernelDesign(d.family, d.arch, d.dtype, d.layout, Knobs.of(**knobs))


def epilogue(d: KernelDesign) -> str:
    """The design's fused epilogue by name (``none``: a plain GEMM)."""
    return EPILOGUES[optional_value(d, EPILOGUE)]


def family_epilogues(family: ModuleType) -> tuple[str, ...]:
    """The epilogues a family renders (``none`` only unless it declares more)."""
    return getattr(family, "EPILOGUES", ("none",))


def with_epilogue(d: KernelDesign, name: str) -> KernelDesign:
    """``d`` with epilogue ``name`` (one of ``records.EPILOGUES``; ``none`` removes the
    knob, giving back the plain design and its key). Legality (whether ``d``'s family
    renders it) is checked separately."""
    if name not in EPILOGUES:
        raise ValueError(f"epilogue {name!r} is not one of {EPILOGUES}")
    knobs = {k: v for k, v in d.knobs.as_json().items() if k != EPILOGUE.name}
    if name != "none":
        knobs[EPILOGUE.name] = EPILOGUES.index(name)
    return KernelDesign(d.family, d.arch, d.dtype, d.layout, Knobs.of(**knobs))


@dataclass(frozen=True)
class Features:
    """What the analytic cost model and the proposers see of a design.

    ``bm x bn x bk`` is the CTA's output tile and k step; ``threads`` the CTA as
    launched, ``warps`` its compute warps; ``regs`` and ``smem_bytes`` what one thread
    and one CTA hold; ``split_k`` CTAs per output tile; ``cluster_m`` CTAs that share
    (multicast) one B tile; ``prefetch_tiles`` k tiles a CTA keeps requested ahead of
    its math, or ``stream_bytes`` when its bytes in flight do not depend on K (loads
    straight into registers); ``fill_stages`` what its pipeline fill is priced at;
    ``wgmma`` whether it issues warpgroup MMAs; ``pingpong`` whether its epilogue runs
    under the other warpgroup's math.
    """

    bm: int
    bn: int
    bk: int
    threads: int
    warps: int
    regs: int
    smem_bytes: int
    split_k: int = 1
    cluster_m: int = 1
    prefetch_tiles: int = 0
    stream_bytes: int = 0
    fill_stages: int = 0
    wgmma: bool = False
    pingpong: bool = False


def make(family: str, arch: str, dtype: str, layout: str, **knobs: int) -> KernelDesign:
    """A design of ``family`` with these knob values (legality is checked separately);
    an optional knob at its default is left out (one key per design)."""
    defaults = {k.name: k.default for k in SHARED_KNOBS}
    kept = {n: v for n, v in knobs.items() if n not in defaults or v != defaults[n]}
    return KernelDesign(family, arch, dtype, layout, Knobs.of(**kept))


def declared_reasons(
    d: KernelDesign,
    family: str,
    archs: tuple[str, ...],
    layouts: tuple[str, ...],
    knobs: tuple[Knob, ...],
) -> list[str]:
    """The checks every family's declaration implies: family, arch, dtype and layout
    among its own, exactly its knobs (and any of the optional ``SHARED_KNOBS``, never
    at its default: left out), and each value in its knob's domain."""
    reasons: list[str] = []
    if d.family != family:
        reasons.append(f"family {d.family!r} is not {family!r}")
    if d.arch not in archs:
        reasons.append(f"arch {d.arch!r}: family {family!r} builds for {archs}")
    if d.dtype not in DTYPES:
        reasons.append(f"dtype {d.dtype!r} not in {DTYPES}")
    if d.layout not in layouts:
        reasons.append(f"layout {d.layout!r}: family {family!r} takes {layouts}")
    declared = {k.name: k for k in (*knobs, *SHARED_KNOBS)}
    given = set(d.knobs.names())
    for name in sorted(given - set(declared)):
        reasons.append(f"{name} is not a knob of family {family!r} (its knobs: {list(declared)})")
    for k in SHARED_KNOBS:
        if k.name in given and getattr(d.knobs, k.name) == k.default:
            reasons.append(
                f"{k.name}={k.default} is the default: leave it out (one key per design)"
            )
    for name in [k.name for k in knobs if k.name not in given]:
        reasons.append(f"knob {name} of family {family!r} is missing")
    for name in sorted(given & set(declared)):
        value = getattr(d.knobs, name)
        if value not in declared[name].domain:
            reasons.append(f"{name}={value} is not one of {declared[name].domain}")
    return reasons


def check(d: KernelDesign, family: ModuleType) -> list[str]:
    """Every reason ``d`` is illegal for ``family`` (a family module): the declared
    checks, then (when the design has exactly the family's knobs, so its rules can read
    each one) the family's own rules."""
    reasons = declared_reasons(d, family.FAMILY, family.ARCHS, family.LAYOUTS, family.KNOBS)
    given = d.knobs.as_json().get(EPILOGUE.name, EPILOGUE.default)
    if given in EPILOGUE.domain and EPILOGUES[given] not in family_epilogues(family):
        reasons.append(
            f"epilogue {EPILOGUES[given]!r}: family {family.FAMILY!r} renders "
            f"{list(family_epilogues(family))}"
        )
    optional = {k.name for k in SHARED_KNOBS}
    if set(d.knobs.names()) - optional == {k.name for k in family.KNOBS}:
        reasons += family.rules(d)
    return reasons


def name(d: KernelDesign, knobs: tuple[Knob, ...]) -> str:
    """The design's procedural name (also its kernel symbol): family, arch, dtype,
    layout, then each of the family's knobs by its label, in the declared order, then
    the optional knobs the design sets (a plain design's name has none)."""
    arch = d.arch.replace("sm_", "sm").rstrip("a")
    parts: list[str] = []
    given = set(d.knobs.names())
    for k in (*knobs, *(s for s in SHARED_KNOBS if s.name in given)):
        label = k.spell(getattr(d.knobs, k.name))
        if label.startswith("x") and parts:
            parts[-1] += label
        else:
            parts.append(label)
    return "_".join([f"hgemm_{d.family}_{arch}_{d.dtype}_{d.layout}", *parts])


def gemm_v1_recipe(
    bm: int,
    bn: int,
    threads: int,
    smem_bytes: int,
    align: dict[str, int],
    split_k: int = 1,
    cluster_m: int = 1,
) -> dict[str, Any]:
    """Launch recipe of ABI gemm_v1: grid [ceil(N/bn), ceil(M/bm), split_k], in whole
    compile-time clusters (1, cluster_m, split_k): a split, or CTAs of adjacent M tiles
    that share the other operand's tile."""
    return {
        "abi": "gemm_v1",
        "block": [threads, 1, 1],
        "tile_m": bm,
        "tile_n": bn,
        "split_k": split_k,
        "cluster": [1, cluster_m, split_k],
        "smem_bytes": smem_bytes,
        "align": align,
    }


# Tensor-map boxes for a gemm_v3 kernel that reads no tensor map (sm90direct,
# sm90stream): ABI gemm_v3 is gemm_v2's parameters then the epilogue's, and the runtime
# encodes gemm_v2's two maps from the recipe's boxes for every gemm_v3 kernel; the box
# of sm90tma's smallest swapped tile, which every A and B the kernels take encodes.
UNREAD_TMA_BOXES: dict[str, tuple[int, int]] = {"a": (64, 8), "b": (64, 8)}


def epilogue_recipe(recipe: dict[str, Any], d: KernelDesign) -> dict[str, Any]:
    """``recipe`` as ABI gemm_v3 where ``d`` has a fused epilogue (``"abi": "gemm_v3"``
    and ``"epilogue"``; tensor-map boxes the kernel does not read where the recipe has
    none); unchanged for a plain design. ABI gemm_v3: gemm_v2's parameters, then bias,
    residual, ldr (null / 0 unused), then eps where the epilogue has the RMSNorm row
    scale (docs/contracts.md)."""
    if epilogue(d) == "none":
        return recipe
    out = {**recipe, "abi": "gemm_v3", "epilogue": epilogue(d)}
    out.setdefault("tma", {k: list(v) for k, v in UNREAD_TMA_BOXES.items()})
    return out
