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

from cudal2.hardware import ARCH_LIMITS
from cudal2.records import DTYPES, EPILOGUES, KernelDesign, Knobs

LIMITS = ARCH_LIMITS["sm_90a"]  # every family builds for sm_90a
SMEM_RESERVED_PER_CTA = 1024  # shared memory the driver reserves per resident CTA


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
# Designs that leave room (docs/kernels.md, "Designs that leave room"): ``room`` = r
# promises that 2**r CTAs of the design fit one SM together (registers, shared memory,
# threads), so that while it drains a like-sized CTA of the next kernel, launched early
# by PDL, becomes resident beside each of its CTAs. 0 (``none``, the default, left out of
# the design) promises nothing; 1 ``half``: the CTA takes at most half an SM
# (``__launch_bounds__(THREADS, 2)``); 2 ``quarter``: at most a quarter. A family
# declares which it renders (``ROOMS`` in its module, ``("none",)`` where it has none)
# and checks its register model against the cap (``room_reasons``). Room is a property
# of the tile, as legal without PDL as with it; a search measures it only with PDL
# (``policy.pdl``), since a plain launch waits for the whole previous grid anyway.
ROOMS: tuple[str, ...] = ("none", "half", "quarter")
ROOM = Knob(
    "room",
    tuple(range(len(ROOMS))),
    "room_{}",
    default=0,
    spellings=((1, "half"), (2, "quarter")),
)
# Optional knobs every family takes, after its own in a design's name. Not in a
# family's ``KNOBS`` (its required knobs, which the policy's tokens spell).
SHARED_KNOBS: tuple[Knob, ...] = (PDL_TRIGGER, EPILOGUE, ROOM)


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


def room(d: KernelDesign) -> str:
    """The room the design leaves by name (``none``: it promises nothing)."""
    return ROOMS[optional_value(d, ROOM)]


def room_share(d: KernelDesign) -> int:
    """CTAs of the design that must fit one SM together: 1, 2 (``half``), 4 (``quarter``);
    the ``__launch_bounds__`` minimum of CTAs per SM it is compiled for. 1 where the
    knob is out of its domain (the declared checks report that)."""
    value = d.knobs.as_json().get(ROOM.name, ROOM.default)
    return 2**value if value in ROOM.domain else 1


def family_rooms(family: ModuleType) -> tuple[str, ...]:
    """The room values a family renders (``none`` only unless it declares more)."""
    return getattr(family, "ROOMS", ("none",))


def with_room(d: KernelDesign, name: str) -> KernelDesign:
    """``d`` with room ``name`` (one of ``ROOMS``; ``none`` removes the knob, giving back
    the design without it and its key). Legality is checked separately."""
    if name not in ROOMS:
        raise ValueError(f"room {name!r} is not one of {ROOMS}")
    knobs = {k: v for k, v in d.knobs.as_json().items() if k != ROOM.name}
    if name != "none":
        knobs[ROOM.name] = ROOMS.index(name)
    return KernelDesign(d.family, d.arch, d.dtype, d.layout, Knobs.of(**knobs))


def room_register_cap(threads: int, share: int) -> int:
    """Registers per thread ptxas may use under ``__launch_bounds__(threads, share)``:
    the register file split over ``share`` CTAs, in whole allocation units (8 per
    thread: a warp's registers are allocated 256 at a time), at most 255."""
    per_thread = LIMITS.registers_per_sm // max(threads * share, 1)
    return min(LIMITS.max_registers, per_thread // 8 * 8)


def room_reasons(d: KernelDesign, threads: int, smem_bytes: int, regs: int) -> list[str]:
    """Why ``room_share(d)`` CTAs of ``threads`` threads, ``smem_bytes`` of shared memory
    and ``regs`` modelled registers per thread do not fit one SM together (none for a
    design without room). A register model over the cap would make ptxas spill under
    the launch bound, so it is a reason, not something to let ptxas find out."""
    share = room_share(d)
    if share == 1:
        return []
    out = []
    label = f"room {room(d)!r} ({share} CTAs per SM)"
    if threads * share > LIMITS.max_threads_per_sm:
        out.append(f"{label}: {threads} threads x {share} > {LIMITS.max_threads_per_sm}")
    # each resident CTA also takes 1 KB of the SM's shared memory (the driver's reserve)
    budget = LIMITS.smem_per_sm // share - SMEM_RESERVED_PER_CTA
    if smem_bytes > budget:
        out.append(f"{label}: shared memory {smem_bytes} B > {budget} B")
    cap = room_register_cap(threads, share)
    if regs > cap:
        out.append(f"{label}: {regs} modelled registers > {cap} per thread (would spill)")
    return out


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
    under the other warpgroup's math; ``room_share`` CTAs of the design that fit one SM
    together by its ``room`` knob (1: it promises nothing); ``store_overlap`` whether
    its output stores drain under the next tile's math (sm90tma v5's bulk store).
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
    room_share: int = 1
    store_overlap: bool = False


def family_trial(family: ModuleType, arch: str, dtype: str, layout: str) -> list[KernelDesign]:
    """A family's trial designs for (arch, dtype, layout): legal designs written but not
    yet measured on a GPU, kept out of its ``space`` so that no build proposes them
    unasked (``trial_space``, optional; none where the family declares it not). A build
    searches them only with ``[search] trial = true`` (a sweep that measures them)."""
    trial = getattr(family, "trial_space", None)
    return list(trial(arch, dtype, layout)) if trial is not None else []


def family_epilogue_trial(family: ModuleType, design: KernelDesign) -> list[KernelDesign]:
    """A family's trial variants of ``design``, a design with a fused epilogue
    (``epilogue_trial``, optional: legal designs of that epilogue written but not yet
    measured on a GPU, such as sm90tma's R by TMA); none where the family declares none.
    A build searches them only with ``[search] trial = true``, after ``design``."""
    trial = getattr(family, "epilogue_trial", None)
    return list(trial(design)) if trial is not None else []


def family_optional(family: ModuleType) -> tuple[Knob, ...]:
    """A family's own optional knobs (``OPTIONAL_KNOBS`` in its module: each with a
    default, left out of a design at it, so adding one changes no existing design's key,
    name or source); after its required ``KNOBS`` in a design's name, before the
    ``SHARED_KNOBS``. The policy's tokens spell the values a design sets, after the
    family's knobs (``policy.tokens.spelled_optional``)."""
    return tuple(getattr(family, "OPTIONAL_KNOBS", ()))


def make(
    family: str,
    arch: str,
    dtype: str,
    layout: str,
    optional: tuple[Knob, ...] = (),
    **knobs: int,
) -> KernelDesign:
    """A design of ``family`` with these knob values (legality is checked separately);
    an optional knob (shared, or the family's own ``optional``) at its default is left
    out (one key per design)."""
    defaults = {k.name: k.default for k in (*SHARED_KNOBS, *optional)}
    kept = {n: v for n, v in knobs.items() if n not in defaults or v != defaults[n]}
    return KernelDesign(family, arch, dtype, layout, Knobs.of(**kept))


def declared_reasons(
    d: KernelDesign,
    family: str,
    archs: tuple[str, ...],
    layouts: tuple[str, ...],
    knobs: tuple[Knob, ...],
    optional: tuple[Knob, ...] = (),
) -> list[str]:
    """The checks every family's declaration implies: family, arch, dtype and layout
    among its own, exactly its knobs (and any of the optional ``SHARED_KNOBS`` or the
    family's own ``optional`` ones, never at its default: left out), and each value in
    its knob's domain."""
    reasons: list[str] = []
    if d.family != family:
        reasons.append(f"family {d.family!r} is not {family!r}")
    if d.arch not in archs:
        reasons.append(f"arch {d.arch!r}: family {family!r} builds for {archs}")
    if d.dtype not in DTYPES:
        reasons.append(f"dtype {d.dtype!r} not in {DTYPES}")
    if d.layout not in layouts:
        reasons.append(f"layout {d.layout!r}: family {family!r} takes {layouts}")
    declared = {k.name: k for k in (*knobs, *optional, *SHARED_KNOBS)}
    given = set(d.knobs.names())
    for name in sorted(given - set(declared)):
        reasons.append(f"{name} is not a knob of family {family!r} (its knobs: {list(declared)})")
    for k in (*optional, *SHARED_KNOBS):
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
    reasons = declared_reasons(
        d, family.FAMILY, family.ARCHS, family.LAYOUTS, family.KNOBS, family_optional(family)
    )
    given = d.knobs.as_json().get(EPILOGUE.name, EPILOGUE.default)
    if given in EPILOGUE.domain and EPILOGUES[given] not in family_epilogues(family):
        reasons.append(
            f"epilogue {EPILOGUES[given]!r}: family {family.FAMILY!r} renders "
            f"{list(family_epilogues(family))}"
        )
    given = d.knobs.as_json().get(ROOM.name, ROOM.default)
    if given in ROOM.domain and ROOMS[given] not in family_rooms(family):
        reasons.append(
            f"room {ROOMS[given]!r}: family {family.FAMILY!r} renders {list(family_rooms(family))}"
        )
    optional = {k.name for k in (*SHARED_KNOBS, *family_optional(family))}
    if set(d.knobs.names()) - optional == {k.name for k in family.KNOBS}:
        reasons += family.rules(d)
    return reasons


def name(d: KernelDesign, knobs: tuple[Knob, ...], optional: tuple[Knob, ...] = ()) -> str:
    """The design's procedural name (also its kernel symbol): family, arch, dtype,
    layout, then each of the family's knobs by its label, in the declared order, then
    the optional knobs the design sets, the family's own (``optional``) first (a plain
    design's name has none)."""
    arch = d.arch.replace("sm_", "sm").rstrip("a")
    parts: list[str] = []
    given = set(d.knobs.names())
    for k in (*knobs, *(s for s in (*optional, *SHARED_KNOBS) if s.name in given)):
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
