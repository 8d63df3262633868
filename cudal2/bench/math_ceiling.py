"""How far issue 22's prefill target is from the power limit: the math ceiling.

``bench/experiments/math_ceiling.py`` runs, on the GPU and in one process, torch.matmul
on each prefill shape and a kernel that only issues wgmma on operands already in shared
memory (``math_ceiling.cu``: no data movement in its loop), each for seconds at a time
(the power limit's regime), sampling power, SM clock and temperature. No GEMM doing the
same FLOPs can beat that kernel's sustained rate under the same power limit, so

    ceiling = math TFLOP/s / best vendor TFLOP/s

bounds any kernel's speedup over the best vendor on the shape. The best vendor's rate
comes from the committed bench file (``cudal2-bench``, every vendor in one process) as
its speedup over torch there, applied to this run's torch rate (clocks differ between
runs; the read ceiling scales the same way). Here: the raw record's analysis and its
markdown (CPU only); the script writes the raw record, then ``analyse``'s result.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from cudal2.bench.report import geomean

# Per run, beside time_sustained's record: the TFLOP/s, and the monitor's summary of the
# run's window (None where the monitor took no sample in it).
RUN_KEYS = ("tflops", "power_w", "sm_mhz", "temp_c_max")
MONITORED = RUN_KEYS[1:]
TARGET = 1.03  # issue 22: geomean over the best vendor at M >= 1024
# The feed run's kernels (math_ceiling.py --feed), each optional in a shape's runs:
# name -> the key of its rate over the best vendor.
FEED = {
    "feed": "feed_ceiling",
    "gemm": "gemm_speedup",
    "feedpair": "feedpair_ceiling",
    "gemmpair": "gemmpair_speedup",
    "feedpaced": "feedpaced_ceiling",
    "feedtall": "feedtall_ceiling",
    "feedsk": "feedsk_ceiling",
    "feedsplit": "feedsplit_ceiling",
    "feedtallsk": "feedtallsk_ceiling",
    "feed80": "feed80_ceiling",
    "feed160": "feed160_ceiling",
    "feed192": "feed192_ceiling",
    "feed224": "feed224_ceiling",
}


def _get(d: Any, path: str, where: str) -> Any:
    """``d``'s value at the dotted ``path``, or a ValueError naming the path."""
    cur = d
    for part in path.split("."):
        if isinstance(cur, list):
            if not part.isdigit() or int(part) >= len(cur):
                raise ValueError(f"{where}: {path}: no item {part}")
            cur = cur[int(part)]
        elif isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise ValueError(f"{where}: {path}: missing")
    return cur


def _positive(d: Any, path: str, where: str) -> float:
    v = _get(d, path, where)
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
        raise ValueError(f"{where}: {path} = {v!r}: not a positive number")
    return float(v)


def parse_smi_line(line: str) -> tuple[float, float, float, float] | None:
    """One line of ``nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,temperature.gpu
    --format=csv,noheader,nounits`` as (host time, W, MHz, °C); None for a line without
    all four (a field nvidia-smi reports as [N/A], a partial line)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 4:
        return None
    try:
        t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()  # local time
        return (t, float(parts[1]), float(parts[2]), float(parts[3]))
    except ValueError:
        return None


def window(samples: Sequence[tuple[float, float, float, float]], t0: float, t1: float) -> dict:
    """The monitor's samples (time, W, MHz, °C) taken in [t0, t1]: mean power and SM
    clock, their extremes, the hottest temperature (None for each when there are none)."""
    xs = [s for s in samples if t0 <= s[0] <= t1]
    if not xs:
        return {"power_w": None, "power_w_max": None, "sm_mhz": None, "sm_mhz_min": None,
                "temp_c_max": None, "samples": 0}  # fmt: skip
    return {
        "power_w": round(statistics.fmean(s[1] for s in xs), 1),
        "power_w_max": round(max(s[1] for s in xs), 1),
        "sm_mhz": round(statistics.fmean(s[2] for s in xs), 1),
        "sm_mhz_min": round(min(s[2] for s in xs), 1),
        "temp_c_max": round(max(s[3] for s in xs), 1),
        "samples": len(xs),
    }


def vendor_over_torch(bench_rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int, int], dict]:
    """(m, n, k) -> the best vendor of an fp16 tn offline bench row: its name, µs, the
    row's torch µs, and torch µs / best µs (>= 1: the best vendor's speedup over torch)."""
    got = {}
    for r in bench_rows:
        t = r["target"]
        if r["mode"] != "offline" or t["dtype"] != "fp16" or t["layout"] != "tn":
            continue
        best, torch_us = r["best_vendor"]["median_us"], r["baselines"]["torch"]["median_us"]
        got[(t["m"], t["n"], t["k"])] = {
            "name": r["best_vendor"]["name"],
            "median_us": best,
            "bench_torch_us": torch_us,
            "over_torch": round(torch_us / best, 4),
        }
    return got


def _median_run(runs: Sequence[Mapping[str, Any]], where: str) -> dict[str, float | None]:
    """Per key, the median over a callable's repetitions (power, clock: of the means
    the monitor took in each run's window)."""
    if not runs:
        raise ValueError(f"{where}: no runs")
    out: dict[str, float | None] = {}
    for key in RUN_KEYS:
        xs = [
            _positive(r, key, f"{where}.{i}")
            for i, r in enumerate(runs)
            if key not in MONITORED or _get(r, key, f"{where}.{i}") is not None
        ]
        out[key] = round(statistics.median(xs), 3) if xs else None
    return out


def analyse(raw: Mapping[str, Any], bench_rows: Sequence[Mapping[str, Any]], bench: str) -> dict:
    """``raw`` (the script's record) with, per shape, the medians of torch's and the math
    kernel's runs, the bench file's best vendor and the ceiling; and a summary: the
    geomean ceiling over every shape the bench file has, and over the llm-public ones
    (issue 22's 16). ValueError naming the key path of anything missing or not positive."""
    vendor = vendor_over_torch(bench_rows)
    shapes, ceilings, public = [], [], []
    feed: dict[str, list[float]] = {key: [] for key in FEED.values()}
    for i, s in enumerate(_get(raw, "shapes", "raw")):
        where = f"shapes.{i}"
        m, n, k = (int(_positive(s, f"target.{d}", where)) for d in "mnk")
        rec = dict(s)
        rec["torch"] = _median_run(_get(s, "runs.torch", where), f"{where}.runs.torch")
        rec["math"] = _median_run(_get(s, "runs.math", where), f"{where}.runs.math")
        present = [name for name in FEED if name in _get(s, "runs", where)]
        for name in present:
            rec[name] = _median_run(_get(s, f"runs.{name}", where), f"{where}.runs.{name}")
        v = vendor.get((m, n, k))
        if v is not None:
            best = rec["torch"]["tflops"] * v["over_torch"]  # at this run's clocks
            ceiling = rec["math"]["tflops"] / best
            rec["vendor"] = {**v, "bench": bench, "tflops": round(best, 3)}
            rec["ceiling_speedup"] = round(ceiling, 4)
            ceilings.append(ceiling)
            if s.get("llm_public"):
                public.append(ceiling)
            for name in present:
                rec[FEED[name]] = round(rec[name]["tflops"] / best, 4)
                feed[FEED[name]].append(rec[name]["tflops"] / best)
        shapes.append(rec)
    out = dict(raw)
    out["shapes"] = shapes
    out["summary"] = {
        "bench": bench,
        "shapes": len(ceilings),
        "geomean_ceiling": round(geomean(ceilings), 4) if ceilings else None,
        "llm_public_shapes": len(public),
        "geomean_ceiling_llm_public": round(geomean(public), 4) if public else None,
        "min_ceiling": round(min(ceilings), 4) if ceilings else None,
        "max_ceiling": round(max(ceilings), 4) if ceilings else None,
        "shapes_allowing_target": sum(c >= TARGET for c in ceilings),
    }
    for key, xs in feed.items():
        if xs:
            out["summary"][key] = {
                "shapes": len(xs),
                "geomean": round(geomean(xs), 4),
                "min": round(min(xs), 4),
                "max": round(max(xs), 4),
                "shapes_at_target": sum(x >= TARGET for x in xs),
            }
    return out


def load(text: str, source: str) -> dict:
    """An analysed results file (the script's ``--out``), checked for what the table reads."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not JSON ({e})") from None
    for path in ("env.gpu", "env.power_limit_w", "env.torch", "summary", "shapes"):
        _get(d, path, source)
    for i, s in enumerate(d["shapes"]):
        for who in ("torch", "math"):
            _positive(s, f"{who}.tflops", f"{source}: shapes.{i}")
            for key in MONITORED:
                if _get(s, f"{who}.{key}", f"{source}: shapes.{i}") is not None:
                    _positive(s, f"{who}.{key}", f"{source}: shapes.{i}")
    return d


def _num(x: float | None, unit: str) -> str:
    return f"{x:.0f} {unit}" if x else "–"


def _mhz_w(r: Mapping[str, Any]) -> str:
    mhz, w = r["sm_mhz"], r["power_w"]
    return f"{mhz:.0f} / {w:.0f}" if mhz and w else "–"


def _label(s: Mapping[str, Any]) -> str:
    t = s["target"]
    return f"{t['m']}x{t['n']}x{t['k']}"


def markdown(d: Mapping[str, Any], source: str) -> str:
    """The docs block: per shape torch, the best vendor and the math kernel (TFLOP/s,
    SM clock and power of each sustained run), the ceiling and its geomean; then the
    short run and the variants (operands, instruction shape, grid)."""
    env, summ = d["env"], d["summary"]
    lines = [
        f"{env['gpu']}, power limit {_num(env['power_limit_w'], 'W')}, driver {env['driver']}, "
        f"torch {env['torch']} (`{source}`; best vendor from `{summ['bench']}`, scaled by "
        f"the torch ratio). Medians of {env['reps']} runs of >= {env['seconds']:g} s each, "
        "interleaved; MHz and W are the mean SM clock and power draw over each run's second "
        "half (settled).",
        "",
        "| M×N×K | torch TFLOP/s | torch MHz / W | best vendor TFLOP/s | math TFLOP/s | "
        "math MHz / W | ceiling × best vendor |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in d["shapes"]:
        t, m = s["torch"], s["math"]
        best = f"{s['vendor']['tflops']:.1f}" if "vendor" in s else "–"
        ceiling = f"{s['ceiling_speedup']:.3f}" if "ceiling_speedup" in s else "–"
        lines.append(
            f"| {_label(s)} | {t['tflops']:.1f} | {_mhz_w(t)} | {best} | {m['tflops']:.1f} | "
            f"{_mhz_w(m)} | {ceiling} |"
        )
    gm = summ["geomean_ceiling_llm_public"]
    if summ["shapes"]:
        lines += [
            "",
            f"Geomean ceiling over the best vendor: {summ['geomean_ceiling']:.3f} over "
            f"{summ['shapes']} shapes"
            + (f", {gm:.3f} over the {summ['llm_public_shapes']} llm-public ones" if gm else "")
            + f" (range {summ['min_ceiling']:.3f}–{summ['max_ceiling']:.3f}); "
            f"{summ['shapes_allowing_target']} allow issue 22's {TARGET:.2f}.",
        ]
    else:
        lines += ["", f"No shape of these results is in `{summ['bench']}`: no ceiling."]
    if d.get("short"):
        sh = d["short"]
        lines += [
            "",
            f"Short run ({sh['seconds'] * 1e3:.0f} ms, after {sh['idle_s']:g} s idle): the math "
            f"kernel at {sh['tflops']:.1f} TFLOP/s, before the power limit bites."
            + (
                f" A launch without wgmma (its tile loads, sums and kernel boundary) takes "
                f"{d['fixed_us']:.1f} µs, in every launch of the table's runs."
                if d.get("fixed_us")
                else ""
            ),
        ]
    if d.get("variants"):
        lines += [
            "",
            "| math kernel variant | TFLOP/s | MHz / W | temp °C |",
            "|---|---:|---:|---:|",
        ]
        for name, v in d["variants"].items():
            r = _median_run(v["runs"], f"variants.{name}")
            temp = f"{r['temp_c_max']:.0f}" if r["temp_c_max"] else "–"
            lines.append(f"| {v['label']} | {r['tflops']:.1f} | {_mhz_w(r)} | {temp} |")
    return "\n".join(lines)


def waves(m: int, n: int, sms: int, tile: Sequence[int]) -> tuple[int, float]:
    """A shape's output tiles of ``tile`` (M x N) and how full its waves of ``sms`` CTAs
    are: tiles / (waves * sms), 1.0 when the last wave is full."""
    tiles = -(-m // tile[0]) * -(-n // tile[1])
    return tiles, tiles / (-(-tiles // sms) * sms)


FULL_WAVES = 0.95  # the feed block's summary: shapes whose tiles fill their waves this much


def feed_markdown(d: Mapping[str, Any], source: str) -> str:
    """The feed ceiling's block: per shape the tiles and wave fill at 128x256, torch, the
    best vendor, the math kernel, and each feed kernel of the run (TFLOP/s, × torch in
    this run, × the best vendor) and GEMM twin (× the best vendor); then the geomeans,
    over every shape and over those whose waves are full, and the twins' checks."""
    env, feed = d["env"], d["kernel"]["feed"]
    sms, tile = feed["grid"], feed["tile"]
    present = [name for name in FEED if any(name in s for s in d["shapes"])]
    bounds = [name for name in present if name.startswith("feed")]
    twins = [name for name in present if name not in bounds]
    others = [  # the kernels of other tiles
        f"{x}: {t[0]}x{t[1]}, the last N tile rounded up"
        for x, t in feed.get("tiles", {}).items()
        if x in present
    ]
    lines = [
        f"{env['gpu']}, power limit {_num(env['power_limit_w'], 'W')}, driver {env['driver']}, "
        f"torch {env['torch']} (`{source}`; best vendor from `{d['summary']['bench']}`, scaled "
        f"by the torch ratio). Medians of {env['reps']} runs of >= {env['seconds']:g} s each, "
        f"interleaved; the feed kernels and twins on {sms} CTAs of {tile[0]}x{tile[1]} tiles"
        + (f" ({'; '.join(others)})" if others else "")
        + f", {feed['stages']}-stage ring, walk in groups of {feed['group']} M tiles.",
        "",
        "| M×N×K | tiles (wave fill) | torch TFLOP/s | best vendor | math | "
        + "".join(f"{b} | {b} × torch | {b} × best vendor | " for b in bounds)
        + "".join(f"{t} × best vendor | " for t in twins),
        "|---|" + "---:|" * (4 + 3 * len(bounds) + len(twins)),
    ]
    lines[2] = lines[2].rstrip()
    ratios: dict[str, dict[str, list[tuple[float, float]]]] = {
        b: {"all": [], "full": []} for b in bounds
    }
    for s in d["shapes"]:
        if not any(name in s for name in present):
            continue
        t = s["target"]
        tiles, fill = waves(t["m"], t["n"], sms, tile)
        torch_tf = s["torch"]["tflops"]
        best = f"{s['vendor']['tflops']:.1f}" if "vendor" in s else "–"
        cells = [f"{tiles} ({fill:.2f})", f"{torch_tf:.1f}", best, f"{s['math']['tflops']:.1f}"]
        for b in bounds:
            if b not in s:  # not run on this shape
                cells += ["–"] * 3
                continue
            tf, over = s[b]["tflops"], s.get(FEED[b])
            cells += [f"{tf:.1f}", f"{tf / torch_tf:.3f}", f"{over:.3f}" if over else "–"]
            if over:
                ratios[b]["all"].append((tf / torch_tf, over))
                own = feed.get("tiles", {}).get(b, tile)  # its own tile's waves
                if waves(t["m"], t["n"], sms, own)[1] >= FULL_WAVES:
                    ratios[b]["full"].append((tf / torch_tf, over))
        cells += [f"{s[FEED[x]]:.3f}" if FEED[x] in s else "–" for x in twins]
        lines.append(f"| {_label(s)} | " + " | ".join(cells) + " |")
    lines.append("")
    tiled = {x: f" of its {t[0]}x{t[1]} tiles" for x, t in feed.get("tiles", {}).items()}
    for b in bounds:
        for key, label in (("all", "every shape"), ("full", f"wave fill >= {FULL_WAVES}")):
            xs = ratios[b][key]
            if xs:
                lines.append(
                    f"- {b}, over {label}{tiled.get(b, '') if key == 'full' else ''} "
                    f"({len(xs)}): {geomean([x[0] for x in xs]):.3f} × "
                    f"torch, {geomean([x[1] for x in xs]):.3f} × the best vendor "
                    f"({min(x[1] for x in xs):.3f}–{max(x[1] for x in xs):.3f}); "
                    f"{sum(x[1] >= TARGET for x in xs)} at {TARGET:.2f} or more."
                )
    for b in bounds:  # a feed kernel's count of the k tiles it issued (operands of ones)
        checks = [(s, s[f"{b}_check"]) for s in d["shapes"] if f"{b}_check" in s]
        if checks:
            wrong = [_label(s) for s, c in checks if not c["ok"]]
            lines.append(
                f"- {b}: its k tiles, counted from its sums on operands of ones before it was "
                f"timed, were the shape's on {len(checks) - len(wrong)} of {len(checks)} shapes"
                + (f"; WRONG on {', '.join(wrong)}." if wrong else ".")
            )
    for x in twins:
        summ = d["summary"].get(FEED[x])
        checks = [s[f"{x}_check"] for s in d["shapes"] if f"{x}_check" in s]
        worst = max((c["max_rel_err"] for c in checks), default=None)
        if summ:
            lines.append(
                f"- {x} (a GEMM): {summ['geomean']:.3f} × the best vendor over {summ['shapes']} "
                f"shapes ({summ['min']:.3f}–{summ['max']:.3f}); checked against torch on "
                f"{len(checks)} shapes: "
                + (
                    f"all passed (largest difference {worst:.1e} of torch's largest value)."
                    if checks and all(c["ok"] for c in checks)
                    else "FAILED."
                )
            )
    return "\n".join(lines)


Shape = tuple[int, int, int]


def bounds(
    runs: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[Shape, dict[str, float]], dict[Shape, float]]:
    """Per llm-public shape (issue 22's 16) in ``runs`` (path -> an analysed feed run):
    each stall-free feed kernel's best rate over the best vendor in any run, and the
    shape's wave fill at 128x256."""
    best: dict[Shape, dict[str, float]] = {}
    fill: dict[Shape, float] = {}
    for d in runs.values():
        sms, tile = d["kernel"]["feed"]["grid"], d["kernel"]["feed"]["tile"]
        for s in d["shapes"]:
            if not s.get("llm_public"):
                continue
            t = s["target"]
            key = (t["m"], t["n"], t["k"])
            fill[key] = waves(*key[:2], sms, tile)[1]
            for name, over in FEED.items():
                if name.startswith("feed") and over in s:
                    best.setdefault(key, {})
                    best[key][name] = max(best[key].get(name, 0.0), s[over])
    if not best:
        raise ValueError("no llm-public shape in the feed runs: no bound")
    return best, fill


def bound(runs: Mapping[str, Mapping[str, Any]]) -> tuple[float, int]:
    """The best stall-free feed kernel per llm-public shape over every run in ``runs``:
    the geomean over the best vendor, and over how many shapes."""
    best, _ = bounds(runs)
    return geomean(max(b.values()) for b in best.values()), len(best)


def bound_markdown(runs: Mapping[str, Mapping[str, Any]]) -> str:
    """The feed bounds together (``bounds``): per llm-public shape, each stall-free feed
    kernel's best rate over the best vendor in any of ``runs``, the best of them, and what
    1.03 over the 16 would take from the shapes whose waves the 128x256 tiles leave
    partial, were the others at their bound."""
    best, fill = bounds(runs)
    names = [n for n in FEED if n.startswith("feed") and any(n in b for b in best.values())]
    lines = [
        "Each stall-free feed kernel's rate over the best vendor, its best in any committed "
        "run (" + ", ".join(f"`{p}`" for p in runs) + "), on issue 22's 16 llm-public shapes; "
        "the best of them is the most any GEMM of those designs sustains there.",
        "",
        "| M×N×K | wave fill at 128x256 | " + " | ".join(names) + " | best | of |",
        "|---|---:|" + "---:|" * len(names) + "---:|---|",
    ]
    tops: dict[Shape, float] = {}
    for key in sorted(best, key=lambda k: (fill[k] < FULL_WAVES, k)):
        b = best[key]
        top = max(b, key=lambda n: b[n])
        tops[key] = b[top]
        cells = [f"{b[n]:.3f}" if n in b else "–" for n in names]
        lines.append(
            f"| {key[0]}x{key[1]}x{key[2]} | {fill[key]:.2f} | "
            + " | ".join(cells)
            + f" | {b[top]:.3f} | {top} |"
        )
    full = [v for k, v in tops.items() if fill[k] >= FULL_WAVES]
    part = [v for k, v in tops.items() if fill[k] < FULL_WAVES]
    g, at = geomean(tops.values()), sum(v >= TARGET for v in tops.values())
    lines += [
        "",
        f"- The best per shape, over the {len(tops)} shapes: {g:.3f} × the best vendor "
        f"({min(tops.values()):.3f}–{max(tops.values()):.3f}); {at} at {TARGET:.2f} or more.",
    ]
    if full and part:
        need = (TARGET ** len(tops) / math.prod(full)) ** (1 / len(part))
        lines += [
            f"- Over the {len(full)} whose 128x256 tiles fill their waves (>= {FULL_WAVES}): "
            f"{geomean(full):.3f}; over the {len(part)} others: {geomean(part):.3f}.",
            f"- {TARGET:.2f} over the {len(tops)}, with the {len(full)} at their bound, "
            f"would take the {len(part)} others to {need:.3f} × the best vendor (geomean).",
        ]
    return "\n".join(lines)


# The ncu details page of ncu_prefill_pair.py --feed: (metric, unit, how the table names it).
NCU_FEED_ROWS = (
    ("Duration", "us", "µs"),
    ("SM Frequency", "Ghz", "SM GHz"),
    ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", "%", "tensor pipe % active"),
    ("lts__t_bytes.sum.per_second", "Tbyte/s", "L2 TB/s"),
    ("dram__bytes.sum.per_second", "Tbyte/s", "DRAM TB/s"),
    ("Grid Size", "", "CTAs"),
    ("Cluster Size", "", "cluster"),
)  # fmt: skip
NCU_FEED_ROLES = ("own", "cublaslt", "torch", "feed", "gemm", "math")
# The multicast pair beside torch's 2x1 pair (``FEED=1 EXTRA_METRICS=...``): the bytes each
# level moved in the launch, beside the rates.
NCU_PAIR_ROWS = (
    *NCU_FEED_ROWS[:3],
    ("dram__bytes_read.sum", "Gbyte", "DRAM read GB"),
    ("lts__t_bytes.sum", "Gbyte", "L2 GB"),
    ("l1tex__m_xbar2l1tex_read_bytes.sum", "Gbyte", "L2 to SM GB"),
    ("Cluster Size", "", "cluster"),
)  # fmt: skip
NCU_PAIR_ROLES = ("torch", "feed", "feedpair", "gemm", "gemmpair", "math")
# The paced and tall feed kernels beside torch's and cuBLASLt's kernels (``FEED_KERNELS=
# feed,feedpaced,feedtall``): the same byte rows.
NCU_TALL_ROLES = ("own", "cublaslt", "torch", "feed", "feedpaced", "feedtall", "math")
# The even share beside the feed kernel (``FEED_KERNELS=feed,feedsk``): the same byte rows.
NCU_SK_ROLES = ("own", "cublaslt", "torch", "feed", "feedsk", "math")
# The aligned split beside the even share (``FEED_KERNELS=feed,feedsk,feedsplit``).
NCU_SPLIT_ROLES = ("own", "cublaslt", "torch", "feed", "feedsk", "feedsplit", "math")
# The four shapes of partial waves (``FEED_KERNELS=feed``): the vendors beside the math.
NCU_PARTIAL_ROLES = ("own", "cublaslt", "torch", "feed", "math")
_RANGE = re.compile(r">:([a-z]+):")  # "<default domain>:feed:none:..."
_SCALE = {
    ("Gbyte/s", "Tbyte/s"): 1e-3,
    ("Mhz", "Ghz"): 1e-3,
    ("ms", "us"): 1e3,
    ("Mbyte", "Gbyte"): 1e-3,
    ("Kbyte", "Gbyte"): 1e-6,
}


def ncu_feed_details(
    text: str,
    source: str,
    roles: tuple[str, ...] = NCU_FEED_ROLES,
    metrics: tuple[tuple[str, str, str], ...] = NCU_FEED_ROWS,
) -> dict[str, dict[str, str]]:
    """An ncu details page (``--csv --page details``) of ncu_prefill_pair.py --feed: per
    NVTX range (``roles``: own, cublaslt, torch, math, feed, gemm, ...) its kernel's name
    and metrics (value strings in ``metrics``' units). ValueError naming what is missing."""
    rows = list(csv.DictReader(io.StringIO(text)))
    out: dict[str, dict[str, str]] = {}
    for i, r in enumerate(rows):
        rng = next((v for k, v in r.items() if k and k.startswith("thread Domain")), "") or ""
        m = _RANGE.search(rng)
        if m is None:
            raise ValueError(f"{source}: row {i + 2}: no NVTX range in {rng!r}")
        got = out.setdefault(m[1], {"kernel": r["Kernel Name"]})
        got[r["Metric Name"]] = r["Metric Value"]
        got[r["Metric Name"] + " unit"] = r["Metric Unit"]
    for role in roles:
        if role not in out:
            raise ValueError(f"{source}: no kernel in NVTX range {role!r}")
        for metric, unit, _ in metrics:
            if metric not in out[role]:
                raise ValueError(f"{source}: {role}: no metric {metric!r}")
            have = out[role][metric + " unit"]
            if have != unit and (have, unit) not in _SCALE:
                raise ValueError(f"{source}: {role}: {metric} in {have!r}, not {unit!r}")
    return out


def _value(got: Mapping[str, str], metric: str, unit: str) -> str:
    raw = got[metric].replace(",", "")
    scale = _SCALE.get((got[metric + " unit"], unit))
    return f"{float(raw) * scale:.2f}" if scale else raw


def ncu_feed_markdown(
    files: Mapping[str, str],
    roles: tuple[str, ...] = NCU_FEED_ROLES,
    metrics: tuple[tuple[str, str, str], ...] = NCU_FEED_ROWS,
    what: str = "the sweeps' fastest own kernel (own), cuBLASLt's autotuned algorithm, "
    "torch.matmul, the feed kernel, its GEMM twin and the math kernel at the shape's FLOPs",
    named: tuple[str, ...] = ("own", "cublaslt", "torch"),
) -> str:
    """Per shape (its details page's text by file name) and role, one launch of its
    kernel: the duration, over the feed kernel's, and the rest of ``metrics``; ``what``
    says what the roles are, ``named`` whose kernel names the text gives."""
    got = {name: ncu_feed_details(text, name, roles, metrics) for name, text in files.items()}
    shapes = [re.sub(r"^.*?(\d+x\d+x\d+).*$", r"\1", Path(n).name) for n in files]
    head = [label for _, _, label in metrics]
    lines = [
        "One launch each under ncu (clocks as found, caches flushed; "
        + ", ".join(f"`{n}`" for n in files)
        + f"): {what}. The vendors' {'and own ' if 'own' in named else ''}kernels: "
        + "; ".join(
            f"{s}: " + ", ".join(f"{r} `{g[r]['kernel']}`" for r in named)
            for s, g in zip(shapes, got.values(), strict=True)
        )
        + ".",
        "",
        f"| shape | kernel | {head[0]} | × feed | " + " | ".join(head[1:]) + " |",
        "|---|---|" + "---:|" * (len(head) + 1),
    ]
    for shape, g in zip(shapes, got.values(), strict=True):
        feed_us = float(_value(g["feed"], "Duration", "us"))
        for r in roles:
            cells = [_value(g[r], metric, unit) for metric, unit, _ in metrics]
            ratio = float(cells[0]) / feed_us
            lines.append(
                f"| {shape} | {r} | {cells[0]} | {ratio:.3f} | " + " | ".join(cells[1:]) + " |"
            )
    return "\n".join(lines)
