"""The policy's language: prompt tokens (GPU, target, contrastive history) and design
tokens decoded one at a time under a grammar mask.

A prompt is ``<bos> gpu... target... (<h> design... speed status metrics...)* <design>``,
and the design follows as ``N_FIELDS`` tokens: ``family=...``, then that family's own
knobs in its declared order (``name=value``), then ``room=...`` where the design leaves
room (the optional ``room`` knob; docs/kernels.md "Designs that leave room"), then
``<eod>`` up to ``N_FIELDS``. The
vocabulary is derived from the family registry (``cudal2.generator.families``): every
family, and every value of every knob's domain (a knob name shared by families shares
its tokens). The grammar (``Grammar``) is a trie over a set of legal designs: at every
position it allows only tokens that continue to at least one design of the set, so
every sample is legal (the set is the arch's design space) or measured (the set is a
target's measured designs, for replay).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cudal2.generator import FAMILIES, family_of
from cudal2.generator.families.base import ROOM, family_rooms
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
# it was before they existed). Only ``room``: the PDL trigger is expanded after the
# proposal (policy.pdl) and the epilogue is the target's. Their tokens come last in the
# vocabulary, so the ids of every earlier token stay what a checkpoint trained before
# them learned (``model.load`` extends such a checkpoint).
OPTIONAL_KNOBS = (ROOM,)


def _spells_optional(family: str) -> int:
    """How many optional-knob fields a design of ``family`` may add: one where it
    renders room."""
    return 1 if len(family_rooms(FAMILIES[family])) > 1 else 0


# Design positions: the family, then at most this many knobs (shorter families pad
# with <eod>, which the grammar forces, so padding costs no probability). A family
# that renders room has room for its token (sm90tma, the longest, renders none).
N_FIELDS = 1 + max(len(FAMILIES[f].KNOBS) + _spells_optional(f) for f in FAMILY_NAMES)
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
    """The design as the family's token and its knobs' tokens, in the family's declared
    order; padded with <eod> to ``N_FIELDS`` (where it is decoded) unless ``pad`` is
    false (in a prompt's history)."""
    knobs = [tok(f"{k.name}={getattr(d.knobs, k.name)}") for k in family_of(d.family).KNOBS]
    given = d.knobs.as_json()
    optional = [tok(f"{k.name}={given[k.name]}") for k in OPTIONAL_KNOBS if k.name in given]
    out = [tok(f"family={d.family}"), *knobs, *optional]
    return out + [EOD] * (N_FIELDS - len(out)) if pad else out


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
        self.seqs = [design_tokens(d) for d in self.designs]
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
        g = object.__new__(Grammar)
        g.designs = [self.designs[i] for i in keep]
        g.index = self.index.difference(self.designs[i] for i in gone)
        g.seqs = [self.seqs[i] for i in keep]
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
        v.seqs = [design_tokens(d) for d in v.designs]
        v._children = self._children
        v._through = None
        missing = [
            d.key[:12]
            for d, s in zip(v.designs, v.seqs, strict=True)
            if s[-1] not in self.allowed(s[:-1])
        ]
        if missing:
            raise ValueError(f"designs not in the grammar: {missing[:3]}")
        return v
