"""The policy's measurement corpus: every kernel measured on one GPU model, one compact row
per (target, design), with each target's best-vendor speedup to score against.

Rows come from measurement databases (``Measurement.as_json`` lines). A row keeps what
the policy reads: the target, the design, the status and error kind, the time and the
same-process torch time, the deviation from the reference, the derived and Nsight
Compute metrics, and the source code length (the CUDA-L2 reward's size term). Per
target, ``vendor_speedup`` is the autotuned cuBLASLt algorithm's speedup over torch in
its own record (at least 1: torch is a vendor too), so ``log(torch_us / time_us) -
log(vendor_speedup)`` is the log speedup over the best vendor.

A target is ``holdout`` when a holdout manifest names it: training never reads its
rows, evaluation replays them.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal2.records import CHECK_RECORD, KernelDesign, Target

CORPUS_SCHEMA = 1
METRIC_KEYS = (
    "gbps",
    "tflops",
    "waves",
    "registers",
    "smem_bytes",
    "spill_bytes",
    "ncu_dram_pct",
    "ncu_tensor_pct",
    "ncu_sm_pct",
    "ncu_occupancy_pct",
    "ncu_l2_hit_pct",
)


class CorpusError(ValueError):
    """A corpus file or database line that cannot be read; the message names it."""


@dataclass(frozen=True)
class Row:
    target: Target
    design: KernelDesign
    status: str
    time_us: float | None  # None unless status is ok
    torch_us: float | None
    gpu: str
    proposer: str
    deviation: float | None  # max |err| / the vendors' own max |err| (<= 1 passes)
    metrics: dict[str, float]
    code_chars: int
    split: str = "train"

    @property
    def speedup(self) -> float | None:
        """Over the same-process torch.matmul."""
        if self.status != "ok" or not self.time_us or not self.torch_us:
            return None
        return self.torch_us / self.time_us

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target.as_json(),
            "design": self.design.as_json(),
            "status": self.status,
            "time_us": self.time_us,
            "torch_us": self.torch_us,
            "gpu": self.gpu,
            "proposer": self.proposer,
            "deviation": self.deviation,
            "metrics": self.metrics,
            "code_chars": self.code_chars,
            "split": self.split,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Row:
        return cls(
            target=Target.from_json(d["target"]),
            design=KernelDesign.from_json(d["design"]),
            status=d["status"],
            time_us=d["time_us"],
            torch_us=d["torch_us"],
            gpu=d["gpu"],
            proposer=d["proposer"],
            deviation=d["deviation"],
            metrics=dict(d["metrics"]),
            code_chars=int(d["code_chars"]),
            split=d.get("split", "train"),
        )


@dataclass
class Corpus:
    rows: list[Row]
    vendor_speedup: dict[Target, float] = field(default_factory=dict)
    gpu: str = ""
    # Records of designs the space no longer has (a legality rule added since they
    # were measured): left out, since no proposer can propose them.
    dropped_illegal: int = 0

    def by_target(self, split: str | None = None) -> dict[Target, list[Row]]:
        out: dict[Target, list[Row]] = defaultdict(list)
        for r in self.rows:
            if split is None or r.split == split:
                out[r.target].append(r)
        return dict(out)

    def targets(self, split: str | None = None) -> list[Target]:
        return sorted(self.by_target(split))

    def vendor_log(self, t: Target) -> float:
        import math

        return math.log(self.vendor_speedup.get(t, 1.0))


def _read_lines(path: Path) -> Iterable[tuple[int, dict]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}:{i}: not JSON ({e.msg})") from e


def _deviation(rec: dict) -> float | None:
    err, bound = rec.get("max_abs_err"), rec.get("metrics", {}).get("vendor_max_abs_err")
    if err is None or not bound:
        return None
    return round(err / bound, 4)


def collect(
    databases: Sequence[str | Path],
    holdout: Iterable[Target] = (),
    gpu_prefix: str = "NVIDIA H100",
    mode: str = "offline",
) -> Corpus:
    """Rows of every kernel record of ``databases`` measured on ``gpu_prefix`` in
    ``mode``; a (target, design) measured more than once keeps its latest record."""
    from cudal2.generator import design_name
    from cudal2.generator.render import IllegalDesignError, render

    holdout = set(holdout)
    latest: dict[tuple[Target, str], tuple[str, Row]] = {}
    vendor: dict[Target, float] = {}
    code_chars: dict[str, int] = {}
    gpus: set[str] = set()
    illegal = 0
    for db in databases:
        path = Path(db)
        for i, rec in _read_lines(path):
            if isinstance(rec, dict) and rec.get("record") == CHECK_RECORD:
                continue  # a compute-sanitizer check line: nothing measured to learn from
            try:
                gpu = rec["gpu"]["name"]
                if not gpu.startswith(gpu_prefix) or rec.get("mode", "offline") != mode:
                    continue
                t = Target.from_json(rec["target"])
                torch_us = rec.get("baselines_us", {}).get("torch")
                if rec.get("design") is None:  # a vendor (cuBLASLt) record
                    if rec["status"] == "ok" and torch_us and rec.get("median_us"):
                        vendor[t] = max(vendor.get(t, 1.0), torch_us / rec["median_us"])
                    continue
                d = KernelDesign.from_json(rec["design"])
            except (KeyError, TypeError) as e:
                raise CorpusError(f"{path}:{i}: not a measurement record ({e!r})") from e
            gpus.add(gpu)
            if d.key not in code_chars:
                try:
                    code_chars[d.key] = len(render(d))
                except IllegalDesignError:  # measured before a legality rule excluded it
                    code_chars[d.key] = -1
            if code_chars[d.key] < 0:
                illegal += 1
                continue
            ok = rec["status"] == "ok"
            row = Row(
                target=t,
                design=d,
                status=rec["status"],
                time_us=rec.get("median_us") if ok else None,
                torch_us=torch_us,
                gpu=gpu,
                proposer=rec.get("proposer", ""),
                deviation=_deviation(rec),
                metrics={k: rec["metrics"][k] for k in METRIC_KEYS if k in rec.get("metrics", {})},
                code_chars=code_chars[d.key],
                split="holdout" if t in holdout else "train",
            )
            key = (t, d.key)
            stamp = rec.get("measured_at", "")
            if key not in latest or stamp >= latest[key][0]:
                latest[key] = (stamp, row)
    rows = sorted((r for _, r in latest.values()), key=lambda r: (r.target, design_name(r.design)))
    return Corpus(rows, vendor, ", ".join(sorted(gpus)), illegal)


def write(corpus: Corpus, path: str | Path) -> None:
    """Gzipped JSON lines, written atomically (a temporary file, then a rename); the
    gzip header carries no time stamp, so the same corpus gives the same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {
        "corpus_schema": CORPUS_SCHEMA,
        "gpu": corpus.gpu,
        "dropped_illegal": corpus.dropped_illegal,
        "vendor_speedup": [
            {"target": t.as_json(), "speedup": round(s, 5)}
            for t, s in sorted(corpus.vendor_speedup.items())
        ],
    }
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        gz.write((json.dumps(head, sort_keys=True) + "\n").encode())
        for r in corpus.rows:
            gz.write((json.dumps(r.as_json(), sort_keys=True) + "\n").encode())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load(path: str | Path) -> Corpus:
    path = Path(path)
    if not path.exists():
        raise CorpusError(f"{path}: no such corpus file")
    lines = _read_lines(path)
    try:
        _, head = next(iter(lines))
    except StopIteration:
        raise CorpusError(f"{path}: empty corpus file") from None
    if head.get("corpus_schema") != CORPUS_SCHEMA:
        raise CorpusError(
            f"{path}:1: corpus_schema {head.get('corpus_schema')!r}, expected {CORPUS_SCHEMA}"
        )
    vendor = {Target.from_json(v["target"]): v["speedup"] for v in head["vendor_speedup"]}
    rows = []
    for i, d in lines:
        try:
            rows.append(Row.from_json(d))
        except (KeyError, TypeError) as e:
            raise CorpusError(f"{path}:{i}: not a corpus row ({e!r})") from e
    return Corpus(rows, vendor, head.get("gpu", ""), head.get("dropped_illegal", 0))
