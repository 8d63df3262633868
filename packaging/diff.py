"""Comparing two dispatch tables (e.g. two releases of one kernel wheel).

Entries are matched by identity, ``TableEntry.key``: (gpu, arch, dtype, layout, n, k,
m_measured). A target only in the new table is *added*, only in the old one
*removed*. A matched target is *changed* when its kernel (or cuBLASLt algorithm) was
swapped, it moved between kernel, cuBLASLt algorithm and fallback, what runs changed
under the same name (a kernel's cubin bytes or launch recipe, a cuBLASLt algorithm's
bytes or library version), or its ``time_us`` moved by more than the noise
threshold. A *regression* is a matched target whose time got slower by more than a
threshold; since the GPU model is part of the match,
regressions only ever compare measurements of one GPU model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .runtime.table import DispatchTable, TableEntry

# Reason codes of a changed row (``reasons``), in the order they are reported.
KERNEL_SWAPPED = "kernel_swapped"
TO_FALLBACK = "to_fallback"
TO_KERNEL = "to_kernel"
TO_CUBLASLT = "to_cublaslt"
CUBIN_CHANGED = "cubin_changed"
LAUNCH_CHANGED = "launch_changed"
ALGO_CHANGED = "algo_changed"
SLOWER = "slower"
FASTER = "faster"

_REASON_LABELS = {
    KERNEL_SWAPPED: "swapped",
    TO_FALLBACK: "->fallback",
    TO_KERNEL: "->kernel",
    TO_CUBLASLT: "->cublaslt",
    CUBIN_CHANGED: "cubin changed",
    LAUNCH_CHANGED: "launch changed",
    ALGO_CHANGED: "algorithm changed",
}


@dataclass(frozen=True)
class DiffResult:
    """The difference between two tables; every row is a plain JSON-ready dict.

    Each row has ``change`` ("added", "removed", "changed" or "unchanged"), the
    target (``gpu``, ``arch``, ``dtype``, ``layout``, ``m`` = m_measured, ``n``,
    ``k``), ``before`` and ``after`` (``{"kind", "kernel", "cubin_sha256", "time_us",
    "speedup"}`` or null where the target is absent), ``time_pct`` (percent change of time_us,
    positive = slower; null unless matched) and ``reasons`` (codes, see module).
    ``regressions`` holds the matched rows slower than ``regression_pct``.
    """

    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    changed: list[dict[str, Any]]
    regressions: list[dict[str, Any]]
    noise_pct: float
    regression_pct: float
    # Every matched target, changed or not, so other thresholds can be asked later.
    matched: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def empty(self) -> bool:
        """True when nothing was added, removed or changed."""
        return not (self.added or self.removed or self.changed)

    def regressions_over(self, pct: float) -> list[dict[str, Any]]:
        """Matched targets whose time_us got slower by more than ``pct`` percent."""
        return [row for row in self.matched if row["time_pct"] > pct]

    def as_json(self) -> dict[str, list[dict[str, Any]]]:
        """``{"added", "removed", "changed", "regressions"}`` as lists of row dicts."""
        return {
            "added": [dict(r) for r in self.added],
            "removed": [dict(r) for r in self.removed],
            "changed": [dict(r) for r in self.changed],
            "regressions": [dict(r) for r in self.regressions],
        }


def diff_tables(
    old: DispatchTable,
    new: DispatchTable,
    noise_pct: float = 2.0,
    regression_pct: float | None = None,
) -> DiffResult:
    """Compare two format-1 tables.

    ``noise_pct``: a time move of at most this many percent does not make a
    target "changed". ``regression_pct``: how much slower a target must get to
    count as a regression; defaults to ``noise_pct``.
    """
    if noise_pct < 0:
        raise ValueError(f"noise_pct must be >= 0, got {noise_pct}")
    if regression_pct is None:
        regression_pct = noise_pct
    before = {e.key: e for e in old.entries}
    after = {e.key: e for e in new.entries}

    added, removed, changed, matched = [], [], [], []
    for key in sorted(before.keys() | after.keys()):
        b, a = before.get(key), after.get(key)
        if b is None:
            added.append(_row("added", a, None, a))
        elif a is None:
            removed.append(_row("removed", b, b, None))
        else:
            row = _matched_row(b, a, noise_pct)
            matched.append(row)
            if row["change"] == "changed":
                changed.append(row)
    regressions = [row for row in matched if row["time_pct"] > regression_pct]
    return DiffResult(
        added=added,
        removed=removed,
        changed=changed,
        regressions=regressions,
        noise_pct=noise_pct,
        regression_pct=regression_pct,
        matched=matched,
    )


def _summary(entry: TableEntry) -> dict[str, Any]:
    return {
        "kind": entry.kind,
        "kernel": entry.kernel,
        "cubin_sha256": entry.cubin_sha256,
        "time_us": entry.time_us,
        "speedup": entry.speedup,
    }


def _row(
    change: str,
    entry: TableEntry,
    before: TableEntry | None,
    after: TableEntry | None,
    time_pct: float | None = None,
    reasons: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "change": change,
        "gpu": entry.gpu,
        "arch": entry.arch,
        "dtype": entry.dtype,
        "layout": entry.layout,
        "m": entry.m_measured,
        "n": entry.n,
        "k": entry.k,
        "before": _summary(before) if before is not None else None,
        "after": _summary(after) if after is not None else None,
        "time_pct": time_pct,
        "reasons": list(reasons or []),
    }


def _matched_row(b: TableEntry, a: TableEntry, noise_pct: float) -> dict[str, Any]:
    reasons: list[str] = []
    if b.kind != a.kind:
        reasons.append({"fallback": TO_FALLBACK, "cublaslt": TO_CUBLASLT}.get(a.kind, TO_KERNEL))
    elif b.kind != "fallback" and b.kernel != a.kernel:
        reasons.append(KERNEL_SWAPPED)
    else:
        reasons.extend(_same_name_changes(b, a))
    time_pct = (a.time_us - b.time_us) / b.time_us * 100.0
    if abs(time_pct) > noise_pct:
        reasons.append(SLOWER if time_pct > 0 else FASTER)
    change = "changed" if reasons else "unchanged"
    return _row(change, a, b, a, time_pct=time_pct, reasons=reasons)


def _same_name_changes(b: TableEntry, a: TableEntry) -> list[str]:
    """What changed in what runs, for two entries of one kind and one kernel name."""
    if b.kind == "kernel":
        return [
            reason
            for reason, changed in (
                (CUBIN_CHANGED, b.cubin_sha256 != a.cubin_sha256),
                (LAUNCH_CHANGED, b.launch != a.launch),
            )
            if changed
        ]
    if b.kind == "cublaslt" and b.cublaslt != a.cublaslt:
        return [ALGO_CHANGED]
    return []


def _side(summary: dict[str, Any] | None) -> str:
    if summary is None:
        return "-"
    return summary["kernel"] if summary["kind"] != "fallback" else "fallback"


def _pair(row: dict[str, Any], key: str, fmt: str) -> str:
    def one(summary: dict[str, Any] | None) -> str:
        if summary is None or summary[key] is None:
            return "-"
        return format(summary[key], fmt)

    return f"{one(row['before'])} -> {one(row['after'])}"


def _change_label(row: dict[str, Any]) -> str:
    if row["change"] in ("added", "removed"):
        return row["change"]
    labels = []
    for reason in row["reasons"]:
        if reason in (SLOWER, FASTER):
            labels.append(f"{reason} {row['time_pct']:+.1f}%")
        else:
            labels.append(_REASON_LABELS[reason])
    return ", ".join(labels) or f"{row['time_pct']:+.1f}%"


def render_text(result: DiffResult) -> str:
    """An aligned, human-readable table of the difference plus a one-line summary."""
    if result.empty and not result.regressions:
        return "no changes\n"
    header = (
        "change",
        "gpu",
        "dtype/layout",
        "M",
        "N",
        "K",
        "before",
        "after",
        "time us before -> after",
        "speedup before -> after",
    )
    numeric = {3, 4, 5}  # M, N, K are right-aligned
    # Regressions below the noise threshold are not "changed" but still shown.
    rows = {id(r): r for r in (*result.removed, *result.added, *result.changed)}
    rows.update({id(r): r for r in result.regressions})
    ordered = sorted(rows.values(), key=_row_order)
    lines = [header]
    for r in ordered:
        lines.append(
            (
                _change_label(r),
                r["gpu"],
                f"{r['dtype']}/{r['layout']}",
                str(r["m"]),
                str(r["n"]),
                str(r["k"]),
                _side(r["before"]),
                _side(r["after"]),
                _pair(r, "time_us", ".2f"),
                _pair(r, "speedup", ".3f"),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for line in lines:
        cells = [
            cell.rjust(w) if i in numeric else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        ]
        out.append("  ".join(cells).rstrip())
    out.append(_summary_line(result))
    return "\n".join(out) + "\n"


def _row_order(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["gpu"], row["dtype"], row["layout"], row["n"], row["k"], row["m"])


def _summary_line(result: DiffResult) -> str:
    parts = [
        f"{len(result.changed)} changed",
        f"{len(result.added)} added",
        f"{len(result.removed)} removed",
        f"{len(result.regressions)} slower by more than {result.regression_pct:g}%",
    ]
    return ", ".join(parts) + f" (noise {result.noise_pct:g}%)"
