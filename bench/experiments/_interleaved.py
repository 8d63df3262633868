"""What the experiments that time torch's ways side by side share
(``gated_baseline.py``, ``rmsnorm_paths.py``): their command line and the summary of
``verify.timing.time_interleaved``'s samples they record."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from cudal2.records import TimingConfig
from cudal2.verify.timing import Timing


def arguments(doc: str) -> tuple[argparse.Namespace, TimingConfig]:
    """``--out`` (the JSON written) and ``--reps`` (repetitions of the interleaved
    timing), and the timing's configuration."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    return args, TimingConfig(reps=args.reps)


def summary(timed: Mapping[str, Timing]) -> dict[str, dict[str, float]]:
    """Each way's median and 10th / 90th percentile, µs a call."""
    return {
        "median_us": {name: t.median_us for name, t in timed.items()},
        "p10_us": {name: t.quantile(0.1) for name, t in timed.items()},
        "p90_us": {name: t.quantile(0.9) for name, t in timed.items()},
    }
