"""The dispatch table (``dispatch.json``, format 1): its one schema, and its lookup.

``DispatchTable`` and ``TableEntry`` are the table as typed, frozen records. The build
writes them (``to_bytes``: canonical JSON), and everything that reads a table goes
through ``DispatchTable.from_json`` / ``from_bytes``: the wheel's runtime at first use,
the diff, the bench, the CI checks. Every record is checked as it is made, so a table
that exists is a table that follows format 1; a broken one raises ``TableError`` with
the key path and the value at fault.

Rules (docs/contracts.md): an entry's identity is ``TableEntry.key`` = (gpu, arch,
dtype, layout, n, k, m_measured), unique in a table. The entries of one (gpu, arch,
dtype, layout, n, k), measured at M1 < M2 < ..., cover ``[1, M1]``, ``[M1+1, M2]``,
...; an M above the largest measured M is not covered. A GPU model absent from the
table is served by the table's first model (in name order) of the same arch: a
stand-in.

Pure Python: no CUDA, no torch. This file ships inside every generated wheel, so it
imports only the standard library and its own files. Keys it does not know are
ignored (a newer writer's additions), and not written back.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from types import MappingProxyType
from typing import Any, NamedTuple

from .abi import (
    ABIS,
    EPILOGUE_ABI,
    EPILOGUE_ACTIVATION,
    EPILOGUE_OPERANDS,
    LIMITS,
    ROPE_KV,
    ROW_SCALED,
)

FORMAT = 1
# A table of 10,000 targets on a few GPU models is a few megabytes; a file far larger
# is not a table, and is refused before it is parsed.
MAX_TABLE_BYTES = 64 << 20
KINDS: tuple[str, ...] = ("kernel", "cublaslt", "fallback")

# Keys that a kernel entry must fill and a fallback entry must leave null.
KERNEL_ONLY_KEYS: tuple[str, ...] = ("kernel", "symbol", "cubin_sha256", "launch", "design_key")
# A cublaslt entry fills these and leaves the rest of KERNEL_ONLY_KEYS null.
CUBLASLT_KEYS: tuple[str, ...] = ("kernel", "design_key")

_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_ALGO_RE = re.compile(r"[0-9a-f]{128}")
_SYMBOL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # an extern "C" name (ASCII only)


class TableError(ValueError):
    """A dispatch table that cannot be read or does not follow format 1."""


class EntryKey(NamedTuple):
    """What identifies one entry, in a table and across tables: one measured target
    on one GPU model. ``str()`` is its short readable name (the runtime's stats).
    ``epilogue``: the fused op the entry serves (``none``: a plain GEMM; the dispatch
    key carries it, so a ``bias`` entry never serves a plain call, nor the reverse)."""

    gpu: str
    arch: str
    dtype: str
    layout: str
    n: int
    k: int
    m_measured: int
    epilogue: str = "none"

    def __str__(self) -> str:
        tail = "" if self.epilogue == "none" else f"/{self.epilogue}"
        return (
            f"{self.gpu}/{self.arch}/{self.dtype}/{self.layout}"
            f"/n{self.n}/k{self.k}/m{self.m_measured}{tail}"
        )


@dataclass(frozen=True)
class CublasLtAlgo:
    """The ``cublaslt`` object of an entry of kind ``cublaslt``: the autotuned
    ``cublasLtMatmulAlgo_t`` (its 64 bytes as 128 hex digits), the cuBLASLt version
    it was measured with, the workspace it needed, and its configuration attributes
    (for people; the runtime does not read them)."""

    version: int
    algo: str
    workspace_bytes: int
    config: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for key in ("version", "workspace_bytes"):
            value = getattr(self, key)
            if not _is_int(value) or value < 0:
                raise TableError(
                    f"key 'cublaslt.{key}' must be a non-negative integer, got {value!r}"
                )
        if not isinstance(self.algo, str) or not _ALGO_RE.fullmatch(self.algo):
            raise TableError(
                "key 'cublaslt.algo' must be 128 lowercase hex digits (the 64 bytes of "
                f"a cublasLtMatmulAlgo_t), got {self.algo!r}"
            )
        if self.config is not None:
            if not isinstance(self.config, Mapping):
                raise TableError(f"key 'cublaslt.config' must be an object, got {self.config!r}")
            object.__setattr__(self, "config", _frozen(self.config))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> CublasLtAlgo:
        """From the entry's ``cublaslt`` object (a missing number reads as null)."""
        return cls(
            obj.get("version"), obj.get("algo"), obj.get("workspace_bytes"), obj.get("config")
        )

    def as_json(self) -> dict[str, Any]:
        out = {"version": self.version, "algo": self.algo, "workspace_bytes": self.workspace_bytes}
        if self.config is not None:
            out["config"] = _plain(self.config)
        return out


# The keys of an entry's ``eager`` object (all required, none null).
EAGER_KEYS: tuple[str, ...] = (*KERNEL_ONLY_KEYS, "time_us")


@dataclass(frozen=True)
class EagerAlt:
    """The ``eager`` object of an entry of kind ``cublaslt`` or ``fallback``: a cudal2
    kernel (the keys of a kernel entry: ``kernel``, ``symbol``, ``cubin_sha256``,
    ``launch``, ``design_key``, and its median ``time_us``) that the runtime launches
    in place of the entry when the caller's stream is not capturing a CUDA graph. Its
    GPU time is within the build's host saving of the entry's (``[build]
    eager_host_saving_us``): eagerly, its cheaper launch wins; under capture, the
    entry's own choice runs. Its launch recipe is checked as a kernel entry's, at the
    entry's shape, when the entry is made."""

    kernel: str
    symbol: str
    cubin_sha256: str
    launch: Mapping[str, Any]
    design_key: str
    time_us: float

    def __post_init__(self) -> None:
        for key in ("kernel", "symbol", "design_key"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise TableError(f"key 'eager.{key}' must be a non-empty string, got {value!r}")
        if not _SYMBOL_RE.fullmatch(self.symbol):
            raise TableError(
                f"key 'eager.symbol' must be a C identifier (a kernel name), got {self.symbol!r}"
            )
        if not isinstance(self.cubin_sha256, str) or not _SHA256_RE.fullmatch(self.cubin_sha256):
            raise TableError(
                "key 'eager.cubin_sha256' must be 64 lowercase hex digits, "
                f"got {self.cubin_sha256!r}"
            )
        if not _is_number(self.time_us) or not 0 < self.time_us < math.inf:
            raise TableError(
                f"key 'eager.time_us' must be a positive finite number, got {self.time_us!r}"
            )
        if not isinstance(self.launch, Mapping):
            raise TableError(f"key 'eager.launch' must be an object, got {self.launch!r}")
        object.__setattr__(self, "launch", _frozen(self.launch))

    def __hash__(self) -> int:
        return hash((self.cubin_sha256, self.symbol))  # ``launch`` is a mapping

    @classmethod
    def from_json(cls, obj: Any) -> EagerAlt:
        """From the entry's ``eager`` object; ``TableError`` names the key at fault."""
        if not isinstance(obj, dict):
            raise TableError(f"key 'eager' must be an object or absent, got {obj!r}")
        for key in EAGER_KEYS:
            if key not in obj:
                raise TableError(f"missing key 'eager.{key}'")
        return cls(**{key: obj[key] for key in EAGER_KEYS})

    def as_json(self) -> dict[str, Any]:
        out = {key: getattr(self, key) for key in EAGER_KEYS}
        out["launch"] = _plain(self.launch)
        return out


@dataclass(frozen=True)
class TableEntry:
    """One entry of format 1: what runs one (gpu, arch, dtype, layout, n, k) at the
    M range [m_min, m_max], measured at m_measured.

    ``kind`` ``kernel``: a cudal2 kernel (``kernel`` its design's name, ``symbol`` its
    extern "C" name, ``cubin_sha256`` its cubin, ``launch`` its recipe, read-only);
    ``cublaslt``: an autotuned cuBLASLt algorithm (``kernel`` its readable name,
    ``cublaslt`` the algorithm); ``fallback``: the baseline is best (``time_us`` is then
    the baseline's). ``epilogue`` (left out of the JSON when ``none``): the fused op the
    entry serves, a kernel of ABI gemm_v3 whose recipe names it, or a fallback (the
    vendor GEMM then torch's op). ``speedup`` / ``spread``: the winner's median speedup over the
    baseline and the noise it had to exceed. ``candidates``: how many measurements
    the build weighed (absent in tables of older builds). ``eager``: on a ``cublaslt``
    or ``fallback`` entry, the kernel launched instead when no CUDA graph is being
    captured (``EagerAlt``; absent unless the build asked for alternatives). Checked
    when made (``TableError``); ``key`` is its identity.
    """

    gpu: str
    arch: str
    dtype: str
    layout: str
    n: int
    k: int
    m_min: int
    m_max: int
    m_measured: int
    kind: str
    kernel: str | None
    symbol: str | None
    cubin_sha256: str | None
    launch: Mapping[str, Any] | None
    time_us: float
    baseline: str
    baseline_us: float | None
    speedup: float | None
    spread: float | None
    design_key: str | None
    measured_at: str
    candidates: int | None = None
    cublaslt: CublasLtAlgo | None = None
    eager: EagerAlt | None = None
    epilogue: str = "none"
    key: EntryKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_entry(self)
        if self.launch is not None:
            object.__setattr__(self, "launch", _frozen(self.launch))
        key = EntryKey(
            self.gpu,
            self.arch,
            self.dtype,
            self.layout,
            self.n,
            self.k,
            self.m_measured,
            self.epilogue,
        )
        object.__setattr__(self, "key", key)

    def __hash__(self) -> int:
        return hash(self.key)  # equal entries have equal keys; ``launch`` is a mapping

    @property
    def sort_key(self) -> tuple[Any, ...]:
        """The order of ``entries`` in a canonical table: (gpu, dtype, layout, n, k,
        m_min), then arch and m_measured to break ties."""
        return (
            self.gpu,
            self.dtype,
            self.layout,
            self.n,
            self.k,
            self.m_min,
            self.arch,
            self.m_measured,
        )

    @property
    def m_range(self) -> str:
        """The M range the entry dispatches, as every printed table shows it: ``"2-16"``."""
        return f"{self.m_min}-{self.m_max}"

    @property
    def label(self) -> str:
        """What the entry runs, short, as every printed table names it (the build's
        summary, ``cudal2-diff``): ``family/knobs`` for a cudal2 kernel (its name
        without the ``hgemm_`` prefix and the arch, dtype and layout, which are columns
        of their own: ``sm90stream/8x32x512_w1x1_s3_sk1``), the algorithm's name for
        cuBLASLt, ``fallback`` for the baseline. A kernel name of another form is whole."""
        if self.kind == "fallback" or self.kernel is None:
            return "fallback"
        if self.kind != "kernel":
            return self.kernel
        arch = self.arch.replace("sm_", "sm").rstrip("a")
        head, sep, knobs = self.kernel.partition(f"_{arch}_{self.dtype}_{self.layout}_")
        family = head.removeprefix("hgemm_")
        if not (sep and knobs and head.startswith("hgemm_") and family):
            return self.kernel
        return f"{family}/{knobs}"

    @classmethod
    def from_json(cls, obj: Any) -> TableEntry:
        """An entry from its JSON object; ``TableError`` names the key at fault."""
        if not isinstance(obj, dict):
            raise TableError("an entry must be a JSON object")
        for key in ENTRY_KEYS:
            if key not in obj:
                raise TableError(f"missing key {key!r}")
        lt = obj.get("cublaslt")
        if lt is not None and not isinstance(lt, dict):
            raise TableError(
                "a cublaslt entry needs an object 'cublaslt'"
                if obj["kind"] == "cublaslt"
                else "only a cublaslt entry has key 'cublaslt'"
            )
        eager = obj.get("eager")
        return cls(
            **{key: obj[key] for key in ENTRY_KEYS},
            candidates=obj.get("candidates"),
            cublaslt=None if lt is None else CublasLtAlgo.from_json(lt),
            eager=None if eager is None else EagerAlt.from_json(eager),
            epilogue=obj.get("epilogue", "none"),
        )

    def as_json(self) -> dict[str, Any]:
        """The entry's JSON object (``launch`` as plain dicts and lists)."""
        out = {key: getattr(self, key) for key in ENTRY_KEYS}
        if self.launch is not None:
            out["launch"] = _plain(self.launch)
        if self.candidates is not None:
            out["candidates"] = self.candidates
        if self.cublaslt is not None:
            out["cublaslt"] = self.cublaslt.as_json()
        if self.eager is not None:
            out["eager"] = self.eager.as_json()
        if self.epilogue != "none":  # a plain entry's JSON is what it was before epilogues
            out["epilogue"] = self.epilogue
        return out


class _Index:
    """A table's lookup structures, built once from its entries."""

    __slots__ = ("axes", "models", "resolved", "stand_in")

    def __init__(self, entries: tuple[TableEntry, ...]):
        # (gpu, arch, dtype, layout, n, k, epilogue) -> (sorted m_measured, entries)
        self.axes: dict[tuple, tuple[list[int], list[TableEntry]]] = {}
        self.models: dict[tuple[str, str], list[TableEntry]] = {}
        for e in entries:
            axis = (e.gpu, e.arch, e.dtype, e.layout, e.n, e.k, e.epilogue)
            self.axes.setdefault(axis, ([], []))[1].append(e)
            self.models.setdefault((e.gpu, e.arch), []).append(e)
        for ms, group in self.axes.values():
            # Lookup trusts m_measured, not m_min (the same order in a well-formed table).
            group.sort(key=lambda e: e.m_measured)
            ms.extend(e.m_measured for e in group)
        self.stand_in: dict[str, str] = {}  # arch -> the model standing in for unknown ones
        for gpu, arch in sorted(self.models):
            self.stand_in.setdefault(arch, gpu)
        self.resolved: dict[tuple[str, str], tuple[str | None, bool]] = {}


@dataclass(frozen=True)
class DispatchTable:
    """A whole table of format 1: where it came from, and its entries, kept in the
    canonical order (``TableEntry.sort_key``) with an index built once, so a lookup is
    a dict hit and a bisect. Checked when made (``TableError``): the top-level values,
    no two entries with one ``key``, and ``gpu_models`` / ``archs`` the entries' own.

    ``gpu_models`` / ``archs``: the models and archs of the entries, sorted;
    ``drivers`` / ``cuda_versions``: those the kernels were measured under (the
    runtime needs a driver for the newest CUDA); ``measured_from`` / ``measured_to``:
    the oldest and newest measurement (null for an empty table).
    """

    package: str
    name: str
    version: str
    tool_version: str
    manifest_sha256: str
    gpu_models: tuple[str, ...]
    archs: tuple[str, ...]
    drivers: tuple[str, ...]
    cuda_versions: tuple[str, ...]
    measured_from: str | None
    measured_to: str | None
    entries: tuple[TableEntry, ...]
    _index: _Index = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key in ("package", "name", "version"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise TableError(f"top-level key {key!r} must be a non-empty string")
        for key in ("tool_version", "manifest_sha256"):
            if not isinstance(getattr(self, key), str):
                raise TableError(f"top-level key {key!r} must be a string")
        for key in ("gpu_models", "archs", "drivers", "cuda_versions"):
            value = getattr(self, key)
            if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
                raise TableError(f"top-level key {key!r} must be a list of strings")
            object.__setattr__(self, key, tuple(value))
        for key in ("measured_from", "measured_to"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str):
                raise TableError(f"top-level key {key!r} must be a string or null, got {value!r}")
        if not isinstance(self.entries, list | tuple):
            raise TableError("top-level key 'entries' must be a list")
        seen: dict[EntryKey, int] = {}
        for i, entry in enumerate(self.entries):
            if not isinstance(entry, TableEntry):
                raise TableError(f"entries[{i}]: an entry must be a TableEntry, got {entry!r}")
            if entry.key in seen:
                raise TableError(
                    f"entries[{i}] repeats the target of entries[{seen[entry.key]}] "
                    f"(gpu, arch, dtype, layout, n, k, m_measured) = {tuple(entry.key)[:7]}"
                    + ("" if entry.epilogue == "none" else f", epilogue {entry.epilogue!r}")
                )
            seen[entry.key] = i
        # The runtime picks an arch and a stand-in model from these: they must be the
        # entries' own (as the build writes them), never a claim the entries do not back.
        for key, what, values in (
            ("gpu_models", "GPU models", {e.gpu for e in self.entries}),
            ("archs", "archs", {e.arch for e in self.entries}),
        ):
            if getattr(self, key) != tuple(sorted(values)):
                raise TableError(
                    f"top-level key {key!r} must list the entries' {what}, sorted: "
                    f"{sorted(values)}, got {list(getattr(self, key))}"
                )
        object.__setattr__(self, "entries", tuple(sorted(self.entries, key=lambda e: e.sort_key)))
        object.__setattr__(self, "_index", _Index(self.entries))

    # -- JSON ----------------------------------------------------------------------

    @classmethod
    def from_json(cls, obj: Any, source: str = "<table>") -> DispatchTable:
        """The table of a loaded ``dispatch.json``. ``source`` names it in messages
        (usually its file): ``TableError("<source>: entries[3]: key 'n' must be ...")``."""
        if not isinstance(obj, dict):
            raise TableError(f"{source}: a dispatch table must be a JSON object")
        if "format" not in obj:
            raise TableError(f"{source}: missing top-level key 'format'")
        if not _is_int(obj["format"]) or obj["format"] != FORMAT:
            # 1.0 and true compare equal to 1; a writer of format 1 writes the integer.
            raise TableError(
                f"{source}: unsupported 'format' {obj['format']!r} (this reader knows {FORMAT})"
            )
        for key in TOP_LEVEL_KEYS:
            if key not in obj:
                raise TableError(f"{source}: missing top-level key {key!r}")
        if not isinstance(obj["entries"], list):
            raise TableError(f"{source}: top-level key 'entries' must be a list")
        entries = []
        for i, raw in enumerate(obj["entries"]):
            try:
                entries.append(TableEntry.from_json(raw))
            except TableError as exc:
                raise TableError(f"{source}: entries[{i}]: {exc}") from None
        top = {key: obj[key] for key in TOP_LEVEL_KEYS[1:-1]}  # not format, entries
        try:
            return cls(**top, entries=tuple(entries))
        except TableError as exc:
            raise TableError(f"{source}: {exc}") from None

    @classmethod
    def from_bytes(cls, data: bytes | str, source: str = "<table>") -> DispatchTable:
        """The table of ``dispatch.json``'s bytes (``TableError`` if not JSON, or more
        than ``MAX_TABLE_BYTES``)."""
        if len(data) > MAX_TABLE_BYTES:
            raise TableError(
                f"{source}: {len(data)} bytes, more than a dispatch table may have "
                f"({MAX_TABLE_BYTES})"
            )
        try:
            obj = json.loads(data)
        except RecursionError:
            raise TableError(f"{source}: not valid JSON: nested too deeply") from None
        except (ValueError, TypeError) as exc:  # undecodable, not JSON, a 4300-digit number
            raise TableError(f"{source}: not valid JSON: {exc}") from exc
        try:
            return cls.from_json(obj, source)
        except RecursionError:  # a launch recipe nested nearly as deep as JSON allows
            raise TableError(f"{source}: values nested too deeply") from None

    def as_json(self) -> dict[str, Any]:
        """The table's JSON object, entries in canonical order."""
        top = {key: _plain(getattr(self, key)) for key in TOP_LEVEL_KEYS[1:-1]}
        return {"format": FORMAT, **top, "entries": [e.as_json() for e in self.entries]}

    def to_bytes(self) -> bytes:
        """The canonical ``dispatch.json``: sorted keys, 2-space indent, ASCII, a
        trailing newline, entries in canonical order; equal tables give equal bytes."""
        text = json.dumps(self.as_json(), sort_keys=True, indent=2, ensure_ascii=True)
        return (text + "\n").encode("utf-8")

    # -- lookup --------------------------------------------------------------------

    def resolve_gpu(self, gpu: str, arch: str) -> tuple[str | None, bool]:
        """The table's model that serves ``gpu`` of ``arch``, and whether it is a
        stand-in: ``(gpu, False)`` on an exact match, ``(first model of that arch,
        True)`` otherwise, ``(None, False)`` when the table has nothing for ``arch``."""
        index = self._index
        key = (gpu, arch)
        got = index.resolved.get(key)
        if got is None:
            if key in index.models:
                got = (gpu, False)
            elif arch in index.stand_in:
                got = (index.stand_in[arch], True)
            else:
                got = (None, False)
            index.resolved[key] = got
        return got

    def lookup(
        self,
        gpu: str,
        arch: str,
        dtype: str,
        layout: str,
        m: int,
        n: int,
        k: int,
        epilogue: str = "none",
    ) -> TableEntry | None:
        """The entry serving this GEMM (with fused ``epilogue``) on ``gpu`` (stand-in
        models allowed; see ``resolve_gpu``), or None when it is not covered. The entry
        may be of kind ``fallback``: then the table says the baseline is the best choice."""
        model, _ = self.resolve_gpu(gpu, arch)
        if model is None:
            return None
        return self.lookup_exact(model, arch, dtype, layout, m, n, k, epilogue)

    def lookup_exact(
        self,
        gpu: str,
        arch: str,
        dtype: str,
        layout: str,
        m: int,
        n: int,
        k: int,
        epilogue: str = "none",
    ) -> TableEntry | None:
        """Like ``lookup`` but for a model already resolved (no stand-in search)."""
        found = self._index.axes.get((gpu, arch, dtype, layout, n, k, epilogue))
        if found is None or m < 1:
            return None
        ms, group = found
        # The entry measured at the nearest M at or above m covers m.
        i = bisect.bisect_left(ms, m)
        return group[i] if i < len(ms) else None

    def m_spans(
        self,
        gpu: str,
        arch: str,
        dtype: str,
        layout: str,
        n: int,
        k: int,
        epilogue: str = "none",
    ) -> list[tuple[int, int, TableEntry]]:
        """(first M, last M, entry) of each M range ``lookup_exact`` answers with an
        entry for this axis, by its rule (the entry measured at the nearest M at or
        above covers M): ascending, adjacent, from M = 1 to the largest M measured."""
        found = self._index.axes.get((gpu, arch, dtype, layout, n, k, epilogue))
        if found is None:
            return []
        ms, group = found
        return [(1 if i == 0 else ms[i - 1] + 1, ms[i], e) for i, e in enumerate(group)]

    def models(self) -> list[tuple[str, str]]:
        """Every (GPU model, arch) the table has entries for, sorted."""
        return sorted(self._index.models)

    def entries_for(self, gpu: str, arch: str) -> list[TableEntry]:
        """Every entry of one model and arch (exact model name, no stand-in)."""
        return list(self._index.models.get((gpu, arch), ()))


# Every top-level key of format 1 (format first, entries last) and every key an entry
# must have: the records' fields.
TOP_LEVEL_KEYS: tuple[str, ...] = ("format", *(f.name for f in fields(DispatchTable) if f.init))
ENTRY_KEYS: tuple[str, ...] = tuple(
    f.name for f in fields(TableEntry) if f.init and f.default is MISSING
)


# -- the rules -----------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    # bool is an int subclass; a true/false here is a writer bug, not a size.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_entry(e: TableEntry) -> None:
    """Every rule of format 1 on one entry; the first broken one raises."""
    for key in ("gpu", "arch", "dtype", "layout", "baseline"):
        if not isinstance(getattr(e, key), str) or not getattr(e, key):
            raise TableError(f"key {key!r} must be a non-empty string")
    for key in ("n", "k", "m_min", "m_max", "m_measured"):
        value = getattr(e, key)
        if not _is_int(value) or value < 1:
            raise TableError(f"key {key!r} must be a positive integer, got {value!r}")
    if not e.m_min <= e.m_measured <= e.m_max:
        raise TableError(
            f"need m_min <= m_measured <= m_max, got {e.m_min} / {e.m_measured} / {e.m_max}"
        )
    if not _is_number(e.time_us) or not 0 < e.time_us < math.inf:
        raise TableError(f"key 'time_us' must be a positive finite number, got {e.time_us!r}")
    for key in ("baseline_us", "speedup", "spread"):
        value = getattr(e, key)
        if value is not None and not (_is_number(value) and math.isfinite(value)):
            raise TableError(f"key {key!r} must be a finite number or null, got {value!r}")
    if not isinstance(e.measured_at, str):
        raise TableError(f"key 'measured_at' must be a string, got {e.measured_at!r}")
    if e.candidates is not None and (not _is_int(e.candidates) or e.candidates < 0):
        raise TableError(f"key 'candidates' must be a non-negative integer, got {e.candidates!r}")
    if e.kind not in KINDS:
        raise TableError(f"key 'kind' must be one of {KINDS}, got {e.kind!r}")
    for key in ("kernel", "symbol", "design_key"):
        value = getattr(e, key)
        if value is not None and (not isinstance(value, str) or not value):
            raise TableError(f"key {key!r} must be a non-empty string or null, got {value!r}")
    filled = {"kernel": KERNEL_ONLY_KEYS, "cublaslt": CUBLASLT_KEYS}.get(e.kind, ())
    for key in KERNEL_ONLY_KEYS:
        if key in filled and getattr(e, key) is None:
            raise TableError(f"a {e.kind} entry needs a non-null {key!r}")
        if key not in filled and getattr(e, key) is not None:
            raise TableError(f"a {e.kind} entry must have {key!r} null")
    if e.symbol is not None and not _SYMBOL_RE.fullmatch(e.symbol):
        raise TableError(f"key 'symbol' must be a C identifier (a kernel name), got {e.symbol!r}")
    if e.cubin_sha256 is not None and (
        not isinstance(e.cubin_sha256, str) or not _SHA256_RE.fullmatch(e.cubin_sha256)
    ):
        raise TableError(
            f"key 'cubin_sha256' must be 64 lowercase hex digits, got {e.cubin_sha256!r}"
        )
    if e.launch is not None:
        _check_launch(e.launch, e)
    _check_epilogue(e)
    if e.kind == "cublaslt" and not isinstance(e.cublaslt, CublasLtAlgo):
        raise TableError("a cublaslt entry needs an object 'cublaslt'")
    if e.kind != "cublaslt" and e.cublaslt is not None:
        raise TableError("only a cublaslt entry has key 'cublaslt'")
    if e.eager is not None:
        if not isinstance(e.eager, EagerAlt):
            raise TableError(f"key 'eager' must be an EagerAlt, got {e.eager!r}")
        if e.kind == "kernel":
            raise TableError("only a cublaslt or fallback entry has key 'eager'")
        try:
            _check_launch(e.eager.launch, e)
        except TableError as exc:  # the same rules, named under 'eager'
            raise TableError(str(exc).replace("'launch", "'eager.launch")) from None


def _check_epilogue(e: TableEntry) -> None:
    """An epilogue entry is a gemm_v3 kernel of that epilogue or a fallback, and a
    gemm_v3 kernel serves only the epilogue its recipe names."""
    if not isinstance(e.epilogue, str) or e.epilogue not in EPILOGUE_OPERANDS:
        raise TableError(
            f"key 'epilogue' must be one of {list(EPILOGUE_OPERANDS)}, got {e.epilogue!r}"
        )
    if e.kind == "cublaslt" and e.epilogue != "none":
        raise TableError(f"a cublaslt entry serves no epilogue, got {e.epilogue!r}")
    if e.epilogue in EPILOGUE_ACTIVATION and (not _is_int(e.n) or e.n % 2):
        raise TableError(
            f"key 'epilogue' {e.epilogue!r} gates (gate, up) row pairs: N must be even, got {e.n!r}"
        )
    if e.kind != "kernel" or not isinstance(e.launch, Mapping):
        return
    abi, named = e.launch.get("abi", "gemm_v1"), e.launch.get("epilogue", "none")
    if abi not in ABIS:
        return  # a newer runtime's kernel: this one falls back for it
    if (abi == EPILOGUE_ABI) != (e.epilogue != "none") or named != e.epilogue:
        raise TableError(
            f"key 'epilogue' {e.epilogue!r}: its kernel must be of ABI {EPILOGUE_ABI} with "
            f"'launch.epilogue' {e.epilogue!r} (a plain entry's: gemm_v1 or gemm_v2 and none), "
            f"got ABI {abi!r} and 'launch.epilogue' {named!r}"
        )
    tma = e.launch.get("tma")
    c_box = isinstance(tma, Mapping) and "c" in tma
    if (e.epilogue in ROW_SCALED or e.epilogue in EPILOGUE_ACTIVATION) and (
        e.launch.get("persistent") and not c_box
    ):
        # The one-tile kernel renders them, and of the persistent kernels those storing
        # by TMA (the gated activation, and the row scale): any other is not a design.
        raise TableError(
            f"key 'epilogue' {e.epilogue!r}: its kernel cannot be persistent unless it "
            "stores C by TMA"
        )
    if isinstance(tma, Mapping) and "r" in tma and "residual" not in EPILOGUE_OPERANDS[e.epilogue]:
        # The launcher encodes R's map from the residual operand: an epilogue without one
        # would give it address 0.
        raise TableError(
            f"key 'launch.tma.r': a kernel reading R by TMA needs an epilogue with a "
            f"residual, not {e.epilogue!r}"
        )
    if c_box and e.epilogue in ROPE_KV:
        # The launcher encodes C's map over [M, N] (a gated output's over [M, N / 2]): a
        # RoPE one is not C's shape at all.
        raise TableError(
            f"key 'launch.tma.c': a kernel storing C by TMA writes [M, N], not the output "
            f"of epilogue {e.epilogue!r}"
        )


def _positive_int(value: Any) -> bool:
    return _is_int(value) and value >= 1


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)  # JSON true/false only: never 1, "true" or null


def _non_negative_int(value: Any) -> bool:
    return _is_int(value) and value >= 0


def _positive_ints(size: int) -> Any:
    def check(value: Any) -> bool:
        return (
            isinstance(value, list | tuple)
            and len(value) == size
            and all(_positive_int(x) for x in value)
        )

    return check


# What the launcher reads from a recipe of a known ABI: (key, required, check, what
# it must be). gemm_v2's tensor-map boxes are checked apart.
_RECIPE_RULES: tuple[tuple[str, bool, Any, str], ...] = (
    ("block", True, _positive_ints(3), "a list of 3 positive integers"),
    ("tile_m", True, _positive_int, "a positive integer"),
    ("tile_n", True, _positive_int, "a positive integer"),
    ("smem_bytes", True, _non_negative_int, "a non-negative integer"),
    ("split_k", False, _positive_int, "a positive integer"),
    ("cluster", False, _positive_ints(3), "a list of 3 positive integers"),
    ("persistent", False, _non_negative_int, "a non-negative integer"),
    ("ctas_per_sm", False, _positive_int, "a positive integer"),
    # sm90tma v5: a persistent grid of at most this many CTAs (absent: one per SM slot).
    ("max_ctas", False, _positive_int, "a positive integer"),
    # Programmatic dependent launch: the kernel waits (griddepcontrol.wait) before it
    # reads A or writes C, so the launcher may set programmatic stream serialization.
    ("pdl", False, _is_bool, "true or false"),
    # sm90tma v5 stream-K: a CTA per slot even past the tiles (the last tiles cut along K),
    # and the workspace bytes each CTA takes (the kernel's last parameter).
    ("streamk", False, _non_negative_int, "a non-negative integer"),
    ("workspace_per_cta", False, _positive_int, "a positive integer"),
)


def _check_launch(recipe: Any, e: TableEntry) -> None:
    """The launch recipe's values that the runtime reads. A recipe of an ABI this
    runtime does not know is checked no further: the runtime falls back for it."""
    if not isinstance(recipe, Mapping):
        raise TableError(f"key 'launch' must be an object, got {recipe!r}")
    abi = recipe.get("abi", "gemm_v1")
    if not isinstance(abi, str) or not abi:
        raise TableError(f"key 'launch.abi' must be a non-empty string, got {abi!r}")
    align = recipe.get("align", {})
    if not isinstance(align, Mapping) or not all(
        dim in ("m", "n", "k") and _positive_int(v) for dim, v in align.items()
    ):
        raise TableError(
            f"key 'launch.align' must map 'm', 'n' or 'k' to a positive integer, got {align!r}"
        )
    if abi not in ABIS:
        return
    for key, required, check, what in _RECIPE_RULES:
        if (required or key in recipe) and not check(recipe.get(key)):
            raise TableError(f"key 'launch.{key}' must be {what}, got {recipe.get(key)!r}")
    if recipe.get("streamk") and not (recipe.get("persistent") and "workspace_per_cta" in recipe):
        # its kernel would read a workspace it was never given
        raise TableError(
            "key 'launch.streamk' needs a persistent recipe with 'launch.workspace_per_cta'"
        )
    _check_limits(recipe, e)
    if abi in ("gemm_v2", EPILOGUE_ABI):
        _check_tma(recipe.get("tma"))


def _check_limits(recipe: Mapping[str, Any], e: TableEntry) -> None:
    """The recipe within what the GPU can launch (``abi.LIMITS``), and its grid at the
    entry's own shape (M = m_measured, the largest M the entry serves) within CUDA's
    grid: a launch the driver would refuse is a table that cannot be trusted."""
    lim = LIMITS
    block = recipe["block"]
    if math.prod(block) > lim.block_threads or any(
        b > most for b, most in zip(block, lim.block_dims, strict=True)
    ):
        raise TableError(
            f"key 'launch.block' must be at most {lim.block_threads} threads with dims at "
            f"most {list(lim.block_dims)}, got {list(block)}"
        )
    if recipe["smem_bytes"] > lim.dynamic_smem_bytes:
        raise TableError(
            f"key 'launch.smem_bytes' must be at most {lim.dynamic_smem_bytes} (dynamic "
            f"shared memory per CTA), got {recipe['smem_bytes']!r}"
        )
    cluster = recipe.get("cluster") or (1, 1, 1)
    if math.prod(cluster) > lim.cluster_ctas:
        raise TableError(
            f"key 'launch.cluster' must hold at most {lim.cluster_ctas} CTAs (a portable "
            f"cluster), got {list(cluster)}"
        )
    split_k = recipe.get("split_k", 1)
    if split_k > lim.grid_dims[2] or split_k % cluster[2]:
        raise TableError(
            f"key 'launch.split_k' must be at most {lim.grid_dims[2]} and a multiple of the "
            f"cluster's z ({cluster[2]}): it is the grid's z, got {split_k!r}"
        )
    persistent = recipe.get("persistent", 0)
    if persistent not in (0, 1, 2):
        raise TableError(
            f"key 'launch.persistent' must be 0, 1 (cooperative) or 2 (ping-pong), "
            f"got {persistent!r}"
        )
    if persistent and (cluster[1] != 1 or cluster[2] != 1):
        # A persistent grid is 1-D (x): its clusters, sm90tma's multicast pair [2, 1, 1],
        # lie along x, and the runtime launches whole ones (driver.persistent_grid).
        raise TableError(
            f"key 'launch.cluster' of a persistent recipe must be [c, 1, 1] (its grid is "
            f"1-D), got {list(cluster)}"
        )
    if recipe.get("ctas_per_sm", 1) > lim.ctas_per_sm:
        raise TableError(
            f"key 'launch.ctas_per_sm' must be at most {lim.ctas_per_sm}, "
            f"got {recipe['ctas_per_sm']!r}"
        )
    if not persistent:  # a persistent grid is one CTA per SM slot, in x
        gx = -(-e.n // recipe["tile_n"])
        gy = -(-e.m_measured // recipe["tile_m"])
        grid = (-(-gx // cluster[0]) * cluster[0], -(-gy // cluster[1]) * cluster[1], split_k)
        if any(g > most for g, most in zip(grid, lim.grid_dims, strict=True)):
            raise TableError(
                f"key 'launch.tile_m' / 'launch.tile_n': the entry's own shape (M "
                f"{e.m_measured}, N {e.n}) needs a grid of {list(grid)} CTAs, more than "
                f"CUDA's {list(lim.grid_dims)}"
            )


def _check_tma(tma: Any) -> None:
    """gemm_v2's tensor-map boxes, as ``cuTensorMapEncodeTiled`` takes them with the
    128-byte swizzle: [k, rows], each dimension 1 to 256, a box row (k elements of 2
    bytes) a multiple of 16 bytes and at most the swizzle's 128; C's (``c``, optional: a
    kernel that stores by TMA takes its map after B's) [columns, rows] by the same rule,
    its row 32, 64 or 128 bytes (the swizzle of that span, ``driver.swizzle_bytes``); R's
    (``r``, optional: a kernel that reads the residual by TMA takes its map after C's)
    C's box, beside one."""
    lim = LIMITS
    box = _positive_ints(2)
    if (
        not isinstance(tma, Mapping)
        or not (box(tma.get("a")) and box(tma.get("b")))
        or any(name in tma and not box(tma[name]) for name in ("c", "r"))
        or not set(tma) <= {"a", "b", "c", "r"}
    ):
        raise TableError(
            f"key 'launch.tma' must hold boxes 'a' and 'b' (and optionally 'c', then 'r') "
            f"of 2 positive integers each, got {tma!r}"
        )
    if "r" in tma and ("c" not in tma or list(tma["r"]) != list(tma["c"])):
        # R comes through the TMA store's buffers: the subtile C's box has
        raise TableError(
            f"key 'launch.tma.r' must be C's box 'c' (R by TMA fills the store's subtiles), "
            f"got r {tma['r']!r} beside c {tma.get('c')!r}"
        )
    for name in sorted(tma):
        k, rows = tma[name]
        row_bytes = k * lim.element_bytes
        if name == "c" and row_bytes not in (32, 64, 128):
            # the TMA store's box row is a swizzle's span (driver.swizzle_bytes)
            raise TableError(
                f"key 'launch.tma.c' must be a box [columns, rows] of 16, 32 or 64 columns "
                f"(32, 64 or 128 bytes: a swizzle's span), got {list(tma[name])}"
            )
        if rows > lim.tma_box or row_bytes % 16 or row_bytes > lim.tma_swizzle_bytes:
            raise TableError(
                f"key 'launch.tma.{name}' must be a box [k, rows] with rows at most "
                f"{lim.tma_box} and k * {lim.element_bytes} bytes a multiple of 16 up to "
                f"{lim.tma_swizzle_bytes}, got {list(tma[name])}"
            )


def _frozen(value: Any) -> Any:
    """A read-only copy of a JSON value: objects as mapping proxies, lists as tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _plain(value: Any) -> Any:
    """``_frozen``'s inverse: JSON's dicts and lists."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
