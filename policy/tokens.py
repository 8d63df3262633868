"""The policy's language: prompt tokens (GPU, target, contrastive history) and design
tokens decoded one at a time under a grammar mask.

A prompt is ``<bos> gpu... target... (<h> design... speed status metrics...)* <design>``,
and the design follows as its fields: ``family=...``, then that family's own knobs in
its declared order (``name=value``), then the family's own optional knobs it sets
(``base.family_optional``: sm90tma v5's ``raster``, ``ctas``, ``store``, in their
declared order), then ``room=...`` where the design leaves room (the optional ``room``
knob; docs/kernels.md "Designs that leave room"), then ``<eod>`` up to the grammar's
field count (at least ``BASE_FIELDS``, at most ``N_FIELDS``). An optional knob at its
default is spelled by leaving its token out, so a design that sets none is the token
sequence it was before the knob existed. The
vocabulary is derived from the family registry (``cudal2.generator.families``): every
family, and every value of every knob's domain (a knob name shared by families shares
its tokens). The grammar (``Grammar``) is a trie over a set of legal designs: at every
position it allows only tokens that continue to at least one design of the set, so
every sample is legal (the set is the arch's design space) or measured (the set is a
target's measured designs, for replay). ``decode`` reads a design back from its tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cudal2.generator import FAMILIES, family_of
from cudal2.generator.families.base import (
    ROOM,
    SHARED_KNOBS,
    Knob,
    family_optional,
    family_rooms,
    make,
)
from cudal2.hardware import DATASHEETS, REFERENCE_GPU, datasheet
from cudal2.records import DTYPES, LAYOUTS, KernelDesign, Status, Target

FAMILY_NAMES = tuple(sorted(FAMILIES))
# knob name -> every value any family's domain of that knob has
KNOB_VALUES: dict[str, tuple[int, ...]] = {}
for _fam in FAMILY_NAMES:
    for _knob in FAMILIES[_fam].KNOBS:
        KNOB_VALUES[_knob.name] = tuple(sorted({*KNOB_VALUES.get(_knob.name, ()), *_knob.domain}))


# The optional knobs the policy spells, by the values a design may set (their default
# is spelled by leaving the token out, so a design without them is the token sequence
# it was before they existed): ``room``, then every family's own optional knobs
# (``base.family_optional``, first declaring family first; sm90tma v5's). Not the PDL
# trigger (expanded after the proposal, policy.pdl) nor the epilogue (the target's).
# Their tokens come last in the vocabulary, in this order, so the ids of every earlier
# token stay what a checkpoint trained before them learned (``model.load`` extends such
# a checkpoint): room's after the required knobs' (issue 20), v5's after room's.
def _optional_knobs() -> tuple[Knob, ...]:
    out: dict[str, Knob] = {ROOM.name: ROOM}
    for fam in FAMILY_NAMES:
        for knob in family_optional(FAMILIES[fam]):
            if knob.name in KNOB_VALUES or knob.name in {k.name for k in SHARED_KNOBS}:
                # a required or shared knob's name: its tokens would be spelled twice
                raise ValueError(f"family {fam}: optional knob {knob.name!r} is already a knob")
            if knob.name in out and out[knob.name] != knob:
                raise ValueError(f"family {fam}: optional knob {knob.name!r} declared twice")
            out[knob.name] = knob
    return tuple(out.values())


OPTIONAL_KNOBS = _optional_knobs()


def spelled_optional(family: str) -> tuple[Knob, ...]:
    """The optional knobs a design of ``family`` may spell, in its tokens' order: the
    family's own (declared order), then ``room`` where the family renders room."""
    mod = FAMILIES[family]
    return (*family_optional(mod), *((ROOM,) if len(family_rooms(mod)) > 1 else ()))


def sets_family_optional(d: KernelDesign) -> bool:
    """Whether ``d`` sets one of its family's own optional knobs (sm90tma v5's)."""
    given = d.knobs.as_json()
    return any(
        given.get(k.name, k.default) != k.default for k in family_optional(family_of(d.family))
    )


# Design positions: the family, then at most this many knobs. A grammar pads its designs
# with <eod> (which it then forces, so padding costs no probability) to its longest
# design, and to at least ``BASE_FIELDS``: the longest design that sets no family's own
# optional knob (sm90tma's 8 knobs; sm90stream's 7 and room), the fields every
# checkpoint before sm90tma v5's tokens decoded, so a grammar without v5 designs scores
# and samples exactly as it did (the same sequences, the same draws). ``N_FIELDS``: the
# longest design of all (sm90tma's 8 knobs and its 3 optional ones).
BASE_FIELDS = 1 + max(
    len(FAMILIES[f].KNOBS) + (len(family_rooms(FAMILIES[f])) > 1) for f in FAMILY_NAMES
)
N_FIELDS = 1 + max(len(FAMILIES[f].KNOBS) + len(spelled_optional(f)) for f in FAMILY_NAMES)
SPECIAL = ("<pad>", "<bos>", "<h>", "<design>", "<eod>")
SPEED_STEP = 0.05  # log-speedup buckets
SPEED_MIN, SPEED_MAX = -2.0, 0.4


def status_token(status: str) -> str:
    """The token spelling of a record's status. ``sanitizer`` (a memcheck failure) is
    spelled ``runtime``: a kernel that fails memcheck is a runtime fault a tool caught,
    and the corpus has no such record to learn a token of its own from."""
    return Status.RUNTIME.value if status == Status.SANITIZER else Status(status).value


# The records' statuses (one list: cudal2.records.Status) as the policy spells them, and
# ``pending`` (a token the checkpoints were trained with; nothing emits it now). The
# order is the vocabulary's.
STATUSES = (*dict.fromkeys(status_token(s) for s in Status), "pending")
FRAC_BUCKETS = 10  # metrics as a fraction of the datasheet peak, tenths


def _log2_bucket(x: float, hi: int) -> int:
    return max(0, min(hi, round(math.log2(max(x, 1)))))


def speed_bucket(log_speedup: float) -> int:
    x = min(SPEED_MAX, max(SPEED_MIN, log_speedup))
    return round((x - SPEED_MIN) / SPEED_STEP)


def _vocab() -> tuple[str, ...]:
    toks = list(SPECIAL)
    toks += ["arch=sm_90a", *(f"sms={b}" for b in range(0, 9))]
    toks += [f"bw={b}" for b in range(0, 16)] + [f"tflops={b}" for b in range(0, 16)]
    toks += [f"dtype={d}" for d in DTYPES] + [f"layout={lay}" for lay in LAYOUTS]
    for dim in ("m", "n", "k"):
        toks += [f"{dim}={b}" for b in range(0, 18)]
    toks += [f"waves128={b}" for b in range(0, 12)] + [f"mtiles64={b}" for b in range(0, 12)]
    toks += [f"family={f}" for f in FAMILY_NAMES]
    for name, values in sorted(KNOB_VALUES.items()):
        toks += [f"{name}={v}" for v in values]
    toks += [f"speed={b}" for b in range(speed_bucket(SPEED_MAX) + 1)]
    toks += [f"status={s}" for s in STATUSES]
    for metric in ("dram", "tensor"):
        toks += [f"{metric}={b}" for b in range(FRAC_BUCKETS + 1)]
    for knob in OPTIONAL_KNOBS:  # appended last: earlier ids keep their meaning
        toks += [f"{knob.name}={v}" for v in knob.domain if v != knob.default]
    return tuple(toks)


VOCAB = _vocab()
INDEX = {tok: i for i, tok in enumerate(VOCAB)}
PAD, BOS, HIST, DESIGN, EOD = (INDEX[s] for s in SPECIAL)


def tok(s: str) -> int:
    try:
        return INDEX[s]
    except KeyError:
        raise ValueError(f"token {s!r} is not in the policy's vocabulary") from None


@dataclass(frozen=True)
class GpuFeatures:
    arch: str = "sm_90a"
    sm_count: int = DATASHEETS[REFERENCE_GPU].sm_count
    bandwidth: float = DATASHEETS[REFERENCE_GPU].bandwidth  # bytes/s, datasheet
    flops: float = DATASHEETS[REFERENCE_GPU].flops  # dense fp16, datasheet

    def tokens(self) -> list[int]:
        return [
            tok(f"arch={self.arch}"),
            tok(f"sms={_log2_bucket(self.sm_count / 2, 8)}"),
            tok(f"bw={min(15, round(self.bandwidth / 0.5e12))}"),
            tok(f"tflops={min(15, round(self.flops / 100e12))}"),
        ]


def gpu_features(name: str, sm_count: int | None = None) -> GpuFeatures:
    sheet = datasheet(name)
    return GpuFeatures("sm_90a", sm_count or sheet.sm_count, sheet.bandwidth, sheet.flops)


def target_tokens(t: Target, sm_count: int = 132) -> list[int]:
    waves = math.ceil(t.m / 128) * math.ceil(t.n / 128) / sm_count
    return [
        tok(f"dtype={t.dtype}"),
        tok(f"layout={t.layout}"),
        tok(f"m={_log2_bucket(t.m, 17)}"),
        tok(f"n={_log2_bucket(t.n, 17)}"),
        tok(f"k={_log2_bucket(t.k, 17)}"),
        tok(f"waves128={min(11, max(0, round(math.log2(waves)) + 6))}"),
        tok(f"mtiles64={_log2_bucket(math.ceil(t.m / 64), 11)}"),
    ]


def design_tokens(d: KernelDesign, pad: bool = True) -> list[int]:
    """The design as the family's token, its knobs' tokens in the family's declared
    order, then the optional knobs it sets (``spelled_optional``); padded with <eod> to
    ``BASE_FIELDS`` (where it is decoded; a grammar pads further to its longest design)
    unless ``pad`` is false (in a prompt's history)."""
    knobs = [tok(f"{k.name}={getattr(d.knobs, k.name)}") for k in family_of(d.family).KNOBS]
    given = d.knobs.as_json()
    optional = [
        tok(f"{k.name}={given[k.name]}")
        for k in spelled_optional(d.family)
        if given.get(k.name, k.default) != k.default
    ]
    out = [tok(f"family={d.family}"), *knobs, *optional]
    return _padded(out, BASE_FIELDS) if pad else out


def _padded(seq: list[int], fields: int) -> list[int]:
    return seq + [EOD] * (fields - len(seq))


def decode(ids: Sequence[int], arch: str, dtype: str, layout: str) -> KernelDesign:
    """The design whose tokens (``design_tokens``, padded or not) are ``ids``, for
    (arch, dtype, layout), which the tokens do not spell; legality is checked
    separately. A sequence that spells no design raises ValueError naming why."""
    words = [VOCAB[i] if 0 <= i < len(VOCAB) else f"<id {i}>" for i in ids]
    while words and words[-1] == "<eod>":
        words.pop()
    if not words or not words[0].startswith("family=") or words[0][7:] not in FAMILIES:
        raise ValueError(f"tokens {words[:1]} do not start with a family")
    family = words[0][7:]
    fields = [*family_of(family).KNOBS, *spelled_optional(family)]
    values: dict[str, int] = {}
    rest = words[1:]
    for knob in fields:
        if rest and rest[0].partition("=")[0] == knob.name:
            values[knob.name] = int(rest.pop(0).partition("=")[2])
        elif knob.default is None:
            raise ValueError(f"{family} tokens {words}: knob {knob.name!r} is missing")
    if rest:
        raise ValueError(f"{family} tokens {words}: {rest} out of place")
    return make(family, arch, dtype, layout, family_optional(FAMILIES[family]), **values)


@dataclass(frozen=True)
class HistoryEntry:
    """One earlier candidate: its design, log speedup over the best vendor (None for a
    failure), status, and profile metrics as fractions of the datasheet peaks."""

    design: KernelDesign
    log_speedup: float | None
    status: str
    dram_frac: float | None = None
    tensor_frac: float | None = None

    def tokens(self) -> list[int]:
        out = [HIST, *design_tokens(self.design, pad=False)]
        out.append(tok(f"status={status_token(self.status)}"))
        if self.log_speedup is not None:
            out.append(tok(f"speed={speed_bucket(self.log_speedup)}"))
        for name, frac in (("dram", self.dram_frac), ("tensor", self.tensor_frac)):
            if frac is not None:
                out.append(tok(f"{name}={min(FRAC_BUCKETS, max(0, round(frac * FRAC_BUCKETS)))}"))
        return out


def prompt_tokens(
    gpu: GpuFeatures, t: Target, history: Sequence[HistoryEntry], max_history: int
) -> list[int]:
    """History ordered worst to best (contrastive: the best sits next to the design)."""
    hist = sorted(history, key=lambda h: -9.0 if h.log_speedup is None else h.log_speedup)[
        -max_history:
    ]
    out = [BOS, *gpu.tokens(), *target_tokens(t, gpu.sm_count)]
    for h in hist:
        out += h.tokens()
    return [*out, DESIGN]


class Grammar:
    """A trie over a set of designs, as token ids per field."""

    def __init__(self, designs: Iterable[KernelDesign]):
        self.designs = list(dict.fromkeys(designs))
        if not self.designs:
            raise ValueError("a grammar needs at least one design")
        self.index = set(self.designs)
        own = [design_tokens(d) for d in self.designs]
        # every design padded to the longest (at least BASE_FIELDS: design_tokens's)
        self._lengths = [len(s) for s in own]
        self.fields = max(self._lengths)
        self.seqs = [_padded(s, self.fields) for s in own]
        self._children: dict[tuple[int, ...], set[int]] = {}
        for s in self.seqs:
            for i in range(len(s)):
                self._children.setdefault(tuple(s[:i]), set()).add(s[i])
        self._through: dict[tuple[int, ...], int] | None = None  # ``without``'s, when asked

    def without(self, drop: Iterable[int]) -> Grammar:
        """The grammar of this one's designs but those at indices ``drop``: the designs,
        token sequences and trie ``Grammar`` would build from the rest, in this order,
        without tokenising them again (a build's proposer asks it of one legal space for
        every target and round, minus what each has measured). The trie is shared where
        no dropped design ran through it."""
        gone = set(drop)
        keep = [i for i in range(len(self.designs)) if i not in gone]
        if not keep:
            raise ValueError("a grammar needs at least one design")
        if self._through is None:  # designs through each trie node (a prefix)
            through: dict[tuple[int, ...], int] = {}
            for s in self.seqs:
                for i in range(1, len(s) + 1):
                    node = tuple(s[:i])
                    through[node] = through.get(node, 0) + 1
            self._through = through
        left: dict[tuple[int, ...], int] = {}
        for i in gone:
            s = self.seqs[i]
            for j in range(1, len(s) + 1):
                node = tuple(s[:j])
                left[node] = left.get(node, self._through[node]) - 1
        children = dict(self._children)
        for node, n in left.items():
            if n == 0:  # no design left through it: neither a child nor a prefix
                children.pop(node, None)
                parent = node[:-1]
                if parent in children:
                    children[parent] = children[parent] - {node[-1]}
        for node in [n for n, c in children.items() if not c]:
            del children[node]
        # padded to the longest design left, as Grammar(rest) pads: the fields past it
        # held only <eod> and leave the trie
        fields = max(self._lengths[i] for i in keep)
        seqs = [self.seqs[i] for i in keep]
        if fields < self.fields:
            seqs = [s[:fields] for s in seqs]
            children = {node: c for node, c in children.items() if len(node) < fields}
        g = object.__new__(Grammar)
        g.designs = [self.designs[i] for i in keep]
        g.index = self.index.difference(self.designs[i] for i in gone)
        g._lengths = [self._lengths[i] for i in keep]
        g.fields = fields
        g.seqs = seqs
        g._children = children
        g._through = None
        return g

    def allowed(self, prefix: Sequence[int]) -> list[int]:
        return sorted(self._children.get(tuple(prefix), ()))

    def masks(self) -> list[list[list[int]]]:
        """For every design, the allowed token ids at each of its fields."""
        return [[self.allowed(s[:i]) for i in range(len(s))] for s in self.seqs]

    def view(self, designs: Sequence[KernelDesign]) -> Grammar:
        """The same trie (so the same probabilities), scoring only ``designs`` (which
        must be in it)."""
        v = object.__new__(Grammar)
        v.designs = list(designs)
        v.index = set(v.designs)
        v.fields = self.fields
        v.seqs = [_padded(design_tokens(d), self.fields) for d in v.designs]
        v._children = self._children
        v._through = None
        missing = [
            d.key[:12]
            for d, s in zip(v.designs, v.seqs, strict=True)
            if len(s) != self.fields or s[-1] not in self.allowed(s[:-1])
        ]
        if missing:
            raise ValueError(f"designs not in the grammar: {missing[:3]}")
        return v
