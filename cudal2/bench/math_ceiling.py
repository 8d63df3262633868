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

import json
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from cudal2.bench.report import geomean

# Per run, beside time_sustained's record: the TFLOP/s, and the monitor's summary of the
# run's window (None where the monitor took no sample in it).
RUN_KEYS = ("tflops", "power_w", "sm_mhz", "temp_c_max")
MONITORED = RUN_KEYS[1:]
TARGET = 1.03  # issue 22: geomean over the best vendor at M >= 1024


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
    for i, s in enumerate(_get(raw, "shapes", "raw")):
        where = f"shapes.{i}"
        m, n, k = (int(_positive(s, f"target.{d}", where)) for d in "mnk")
        rec = dict(s)
        rec["torch"] = _median_run(_get(s, "runs.torch", where), f"{where}.runs.torch")
        rec["math"] = _median_run(_get(s, "runs.math", where), f"{where}.runs.math")
        v = vendor.get((m, n, k))
        if v is not None:
            best = rec["torch"]["tflops"] * v["over_torch"]  # at this run's clocks
            ceiling = rec["math"]["tflops"] / best
            rec["vendor"] = {**v, "bench": bench, "tflops": round(best, 3)}
            rec["ceiling_speedup"] = round(ceiling, 4)
            ceilings.append(ceiling)
            if s.get("llm_public"):
                public.append(ceiling)
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
