"""The power-bound ceiling for prefill GEMMs: the most fp16 tensor-core work any kernel
sustains under this GPU's power limit, beside torch.matmul on each prefill shape.

    python bench/experiments/math_ceiling.py --out FILE
        [--shapes bench/shapes/llm-public-prefill.toml]
        [--bench bench/results/h100-llm-public-prefill-v5.jsonl] [--seconds 2] [--reps 3]
        [--feed [feed,gemm,feedpair,gemmpair]] [--no-variants]
    python bench/experiments/math_ceiling.py --dry-run RAW.json --out FILE   (CPU)

In one process, per shape (fp16 tn): torch.matmul as cudal2-bench calls it (operands
uniform(-1, 1), rotated past L2 as ``verify.timing.operand_sets`` sizes them) and the
math kernel (math_ceiling.cu: wgmma on operands loaded into shared memory once, one CTA
per SM, the shape's FLOPs per launch), each run back to back for >= ``--seconds``,
``--reps`` runs each interleaved in random order (``verify.timing.time_sustained``),
while a monitor samples power draw, SM clock and temperature (pynvml if importable,
else ``nvidia-smi -lms 100``). Before the shapes: a check of the kernel's arithmetic
(the sums of its accumulators against the operands' column sums), and one short
(20 ms) run after an idle pause, the rate before the power limit bites; then the
variants (zero operands, m64n128k16, a grid of 128 CTAs) beside the base kernel, run as
long at 8192^3's FLOPs per launch. The shapes run in a seeded random order.

``--feed [KERNELS]`` adds, per shape and in the same interleaved runs, math_ceiling.cu's
feed kernels (comma-separated, default ``feed,gemm``): ``feed`` (the math kernel's wgmma
beside a producer that TMA-loads every operand byte of the shape's 128x256 tiles in a
GEMM's order, the two never waiting on each other: the most a GEMM moving those bytes
can sustain), ``gemm`` (its GEMM twin: the same loads and wgmma in a real ring, C stored:
a plain warp-specialised GEMM), and ``feedpair`` / ``gemmpair``, the same in 2-CTA
clusters along M that multicast B. ``feedpaced`` is ``feed`` held to a GEMM's pace: its
producer loads no further ahead of the math than a 4-stage GEMM's (the consumers still
never wait), so its CTAs walk the tiles in step as a GEMM's do and keep their L2 reuse;
``feedtall`` is the same on 256x176 tiles, the fewest operand bytes per output two
consumer warpgroups can hold. ``feedsk`` is ``feed`` with every SM's share equal: the
whole waves of tiles walked, the last partial wave's k tiles cut into one equal run a CTA
(stream-K without its partial sums); ``feedtallsk`` the same of ``feedtall``;
``feedsplit`` cuts each of the last wave's tiles into equal pieces at the same k
boundaries, one a CTA (where the last wave holds at most half the SMs' tiles).
``feed80``, ``feed160``, ``feed192`` and ``feed224`` are ``feed`` on 128-row tiles of those
widths, the own kernels' on the partial-wave shapes. Each twin
is first checked against torch on the shape, each feed kernel's count of k tiles
against the shape's (operands of ones: ``FeedKernel.count``). ``--no-variants`` skips
the short run and the variants. ``--smoke`` (with ``--feed``) only launches each feed
kernel on 4096^3, checked, and writes its time to ``--out``.

``cudal2.bench.math_ceiling.analyse`` adds the ceiling per shape: math TFLOP/s over the
best vendor's, the latter this run's torch TFLOP/s times the best vendor's speedup over
torch in ``--bench``. The results file is rewritten (atomically) after every shape, so a
run cut short still leaves what it measured. ``--dry-run RAW.json`` runs only the
analysis on a recorded-format raw file (tests use it).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from cudal2.bench.math_ceiling import FEED, analyse, parse_smi_line, window
from cudal2.bench.report import read_results

HERE = Path(__file__).resolve().parent
ARGS_TYPES = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
THREADS = 256
KTILES = 4  # k tiles per round (math_ceiling.cu), all on the one tile in shared memory
TILE_M, TILE_N, TILE_K = 128, 256, 64
FLOPS_PER_ROUND = 2 * TILE_M * TILE_N * TILE_K * KTILES  # per CTA
SMEM_BYTES = (TILE_M + TILE_N) * TILE_K * 2 + 1024  # as math_ceiling.cu
FEED_THREADS, FEED_STAGES, FEED_GROUP = 384, 4, 8  # the feed kernels' block, ring, walk
# Each feed kernel's tile (M x N outputs a CTA; its symbol is f"{name}_n{N}"): 128x256
# but for the tall tile, the fewest operand bytes per output two consumer warpgroups'
# registers hold (176 accumulators a thread; 256 x 192 does not fit).
FEED_TILES = {
    "feedtall": (256, 176),
    "feedtallsk": (256, 176),
    # the own kernels' widths where a 128x256 tile leaves the last wave partial
    "feed80": (128, 80),
    "feed160": (128, 160),
    "feed192": (128, 192),
    "feed224": (128, 224),
}
FEED_TILE = (TILE_M, TILE_N)
# math_ceiling.cu's: the largest tile's ring, two barriers a stage, the paced counters.
_FEED_RING_ROWS = max(m + n for m, n in (FEED_TILE, *FEED_TILES.values()))
FEED_SMEM_BYTES = FEED_STAGES * _FEED_RING_ROWS * TILE_K * 2 + 2 * FEED_STAGES * 8 + 8 + 1024
FEED_TYPES = (None, None, ctypes.c_void_p, ctypes.c_void_p, *(ctypes.c_int,) * 4)
FEED_PAIRED = ("feedpair", "gemmpair")  # 2-CTA clusters along M: B's box is half the tile
GEMM_CHECK_TOL = 5e-3  # max |twin - torch| over max |torch|; a wrong tile is O(1)
PUBLIC_SHAPES = "bench/shapes/llm-public.toml"  # issue 22's 16: its M >= 1024 shapes
SHORT_S, SHORT_IDLE_S = 0.02, 2.0
SETTLED = 0.5  # power and clock: the samples of each run's second half
VARIANT_SHAPE = (8192, 8192, 8192)  # the variants do this shape's FLOPs per launch
# name -> (kernel, grid: "sms" or a CTA count, operands, what the docs call it)
VARIANTS = {
    "base": ("math_n256", "sms", "random", "m64n256k16, random operands, one CTA per SM"),
    "zeros": ("math_n256", "sms", "zeros", "m64n256k16, zero operands"),
    "n128": ("math_n128", "sms", "random", "two m64n128k16 per k16 step"),
    "grid128": ("math_n256", 128, "random", "m64n256k16, 128 CTAs"),
}


class Monitor:
    """Samples (host time, power W, SM MHz, temperature °C) in the background: through
    pynvml every 20 ms where it imports, else from ``nvidia-smi -lms 100``."""

    def __init__(self, index: int) -> None:
        self.samples: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.source = "pynvml"
            target = self._poll_nvml
        except Exception:  # not installed, or no NVML: nvidia-smi reads the same counters
            self._nvml = None
            self.source = "nvidia-smi -lms 100"
            query = "timestamp,power.draw,clocks.sm,temperature.gpu"
            self._proc = subprocess.Popen(
                ["nvidia-smi", "-i", str(index), f"--query-gpu={query}",
                 "--format=csv,noheader,nounits", "-lms", "100"],
                stdout=subprocess.PIPE, text=True, bufsize=1,
            )  # fmt: skip
            target = self._read_smi
        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def _poll_nvml(self) -> None:
        nv, h = self._nvml, self._handle
        while not self._stop.wait(0.02):
            self.samples.append(
                (
                    time.time(),
                    nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                    float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                    float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                )
            )

    def _read_smi(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if (s := parse_smi_line(line)) is not None:
                self.samples.append(s)

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        self._thread.join(timeout=10)


def gpu_env(index: int) -> dict:
    """The GPU, its power limit and driver (nvidia-smi), torch's version."""
    import torch

    fields = "name,driver_version,power.limit,enforced.power.limit,clocks.max.sm"
    line = subprocess.run(
        ["nvidia-smi", "-i", str(index), f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    name, driver, limit, enforced, max_sm = (p.strip() for p in line.split(","))

    def num(x: str) -> float | None:
        try:
            return float(x)
        except ValueError:
            return None

    return {
        "gpu": name,
        "driver": driver,
        "power_limit_w": num(limit),
        "enforced_power_limit_w": num(enforced),
        "max_sm_mhz": num(max_sm),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
    }


def check_smem(cubin: bytes, probe_symbol: str, want: int) -> None:
    """The dynamic shared memory math_ceiling.cu's ``probe_symbol`` reports, against the
    host's ``want`` (a kernel launched with less would write past its allocation)."""
    import torch

    from cudal2.packaging.runtime import driver

    probe = torch.zeros(1, dtype=torch.int32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    driver.Kernel(cubin, probe_symbol, 0).launch(
        (1, 1, 1), (1, 1, 1), stream, (probe.data_ptr(),), (ctypes.c_void_p,)
    )
    if (got := int(probe.item())) != want:
        raise RuntimeError(
            f"math_ceiling.cu ({probe_symbol}) asks {got} B of shared memory, the host {want}"
        )


class MathKernel:
    """math_ceiling.cu's kernels and their per-CTA operand tiles (random and zero)."""

    def __init__(self, cubin: bytes, sms: int) -> None:
        import torch

        from cudal2.packaging.runtime import driver

        self.sms = sms
        self.kernels = {n: driver.Kernel(cubin, n, SMEM_BYTES) for n in ("math_n128", "math_n256")}
        check_smem(cubin, "smem_bytes", SMEM_BYTES)
        gen = torch.Generator(device="cuda")
        gen.manual_seed(0)
        ctas = max(sms, 128)
        a = torch.rand(ctas * TILE_M * TILE_K, generator=gen, device="cuda") * 2 - 1
        b = torch.rand(ctas * TILE_N * TILE_K, generator=gen, device="cuda") * 2 - 1
        self.operands = {
            "random": (a.half(), b.half()),
            "zeros": (torch.zeros_like(a, dtype=torch.half), torch.zeros_like(b, dtype=torch.half)),
        }
        self.out = torch.empty(ctas * THREADS, dtype=torch.float32, device="cuda")

    def grid(self, grid: int | str) -> int:
        return self.sms if grid == "sms" else int(grid)

    def rounds_for(self, flops: float, grid: int | str) -> int:
        """Rounds (of KTILES k tiles each) that do about ``flops`` on ``grid`` CTAs."""
        return max(1, round(flops / (self.grid(grid) * FLOPS_PER_ROUND)))

    def flops(self, rounds: int, grid: int | str) -> int:
        return self.grid(grid) * rounds * FLOPS_PER_ROUND

    def launcher(self, kernel: str, grid: int | str, operands: str, rounds: int):
        import torch

        a, b = self.operands[operands]
        kern, ctas = self.kernels[kernel], self.grid(grid)

        def run(j: int) -> None:
            stream = torch.cuda.current_stream().cuda_stream
            args = (a.data_ptr(), b.data_ptr(), self.out.data_ptr(), rounds)
            kern.launch((ctas, 1, 1), (THREADS, 1, 1), stream, args, ARGS_TYPES)

        return run

    def check(self, kernel: str) -> dict:
        """One round on every CTA: each CTA's accumulator sums must add up to KTILES
        times the sum over k of colsum(A)[k] * colsum(B)[k] (fp64 reference); a wrong
        swizzle or descriptor pairs A's and B's k differently per row and breaks it."""
        import torch

        self.launcher(kernel, "sms", "random", 1)(0)
        torch.cuda.synchronize()
        a, b = (x.double() for x in self.operands["random"])
        a = a[: self.sms * TILE_M * TILE_K].view(self.sms, TILE_M, TILE_K)
        b = b[: self.sms * TILE_N * TILE_K].view(self.sms, TILE_N, TILE_K)
        ref = KTILES * (a.sum(1) * b.sum(1)).sum(1)
        scale = KTILES * (a.abs().sum(1) * b.abs().sum(1)).sum(1)
        got = self.out[: self.sms * THREADS].view(self.sms, THREADS).double().sum(1)
        err = float(((got - ref).abs() / scale).max())
        return {"kernel": kernel, "max_rel_err": err, "ok": err < 1e-6}

    def fixed_us(self) -> float:
        """A launch without wgmma (rounds = 0: the tile loads, the sums, the kernel
        boundary), timed in a graph of back-to-back launches: what each launch costs
        beyond its math, which a shape's launches pay as a GEMM's do."""
        from cudal2.verify.timing import TimingConfig, time_interleaved

        fn = self.launcher("math_n256", "sms", "random", 0)
        return time_interleaved({"rounds0": fn}, 2, TimingConfig(reps=20), est_us=5.0)[
            "rounds0"
        ].median_us

    def short_run(self, seconds: float, idle_s: float) -> dict:
        """One launch of about ``seconds`` after ``idle_s`` of idle: the unthrottled rate."""
        import torch

        rounds = self.rounds_for(seconds * 900e12, "sms")  # sized at ~900 TFLOP/s
        fn = self.launcher("math_n256", "sms", "random", rounds)
        torch.cuda.synchronize()
        time.sleep(idle_s)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(0)
        end.record()
        end.synchronize()
        took = start.elapsed_time(end) / 1000.0
        flops = self.flops(rounds, "sms")
        return {"rounds": rounds, "seconds": round(took, 6), "idle_s": idle_s,
                "tflops": round(flops / took / 1e12, 2)}  # fmt: skip


class FeedKernel:
    """math_ceiling.cu's feed kernels and GEMM twins (FEED) on one shape's operand sets:
    one CTA per SM walking the shape's 128x256 tiles (the pairs: a cluster of two per
    pair of M tiles), the tensor maps encoded per set."""

    def __init__(self, cubin: bytes, sms: int) -> None:
        import torch

        from cudal2.packaging.runtime import driver

        self.sms = sms
        self.kernels = {n: driver.Kernel(cubin, feed_symbol(n), FEED_SMEM_BYTES) for n in FEED}
        check_smem(cubin, "feed_smem_bytes", FEED_SMEM_BYTES)
        self.out = torch.empty(sms * 256, dtype=torch.float32, device="cuda")

    @staticmethod
    def fits(kernel: str, m: int, n: int, k: int) -> bool:
        """``kernel`` takes the shape: whole M tiles (a pair's two), whole k tiles, and
        whole N tiles for the twins (they store C unchecked); a feed kernel's last N tile
        may pass N (TMA fills it with zeros, as a GEMM's loads)."""
        tm, tn = feed_tile(kernel)
        rows = 2 * tm if kernel in FEED_PAIRED else tm
        return m % rows == 0 and k % TILE_K == 0 and (n % tn == 0 or kernel.startswith("feed"))

    def launcher(self, kernel: str, m: int, n: int, k: int, a, w, c):
        """A callable of the operand set index j: ``kernel`` (a name of FEED) on a[j]
        [m, k], w[j] [n, k] (K-major), writing c[j] [m, n] (the twins; the feed kernels
        write only their sums)."""
        import torch

        from cudal2.packaging.runtime import driver

        if not self.fits(kernel, m, n, k):
            raise ValueError(f"{m}x{n}x{k}: {kernel} does not take it (whole tiles, K % 64)")
        kern = self.kernels[kernel]
        tm, tn = feed_tile(kernel)
        b_rows = tn // 2 if kernel in FEED_PAIRED else tn
        maps = [
            (
                driver.tensor_map(a[j].data_ptr(), m, k, k, (TILE_K, tm)),
                driver.tensor_map(w[j].data_ptr(), n, k, k, (TILE_K, b_rows)),
            )
            for j in range(len(a))
        ]

        def run(j: int) -> None:
            stream = torch.cuda.current_stream().cuda_stream
            args = (*maps[j], c[j].data_ptr(), self.out.data_ptr(), m, n, k, FEED_GROUP)
            kern.launch((self.sms, 1, 1), (FEED_THREADS, 1, 1), stream, args, FEED_TYPES)

        return run

    def count(self, kernel: str, m: int, n: int, k: int, a, w) -> dict:
        """How many k tiles a feed kernel's consumers issued over the whole shape, from its
        sums, on operands of ones (a[0]'s and w[0]'s shapes): every k tile adds 64 to each
        of the fixed k tile's TM x TN accumulators, integers that fp32 holds exactly (the
        tensor cores' accumulation truncates; on random operands the count drifted by one
        in 32768 at 4096^3). So the sums over every CTA over TM * TN * 64 must be the
        shape's k tiles, each issued once: a lost or repeated one moves it by 1."""
        import torch

        ones = [torch.ones_like(a[0])], [torch.ones_like(w[0])]
        tm, tn = feed_tile(kernel)
        self.out.zero_()
        self.launcher(kernel, m, n, k, *ones, [self.out])(0)  # C: unwritten
        torch.cuda.synchronize()
        got = self.out.double().sum().item() / (tm * tn * TILE_K)
        want = (m // tm) * -(-n // tn) * (k // TILE_K)
        return {"k_tiles": got, "want": want, "ok": abs(got - want) < 0.25}

    def verify(self, kernel: str, m: int, n: int, k: int, a, w) -> dict:
        """The check before ``kernel`` is timed: a GEMM twin against torch (``check``), a
        feed kernel's count of the k tiles it issued against the shape's (``count``)."""
        return (self.check if kernel.startswith("gemm") else self.count)(kernel, m, n, k, a, w)

    def check(self, twin: str, m: int, n: int, k: int, a, w) -> dict:
        """A GEMM twin on operand set 0 against torch.matmul: max |difference| over max
        |torch|."""
        import torch

        got = torch.empty(m, n, dtype=a[0].dtype, device="cuda")
        self.launcher(twin, m, n, k, a[:1], w[:1], [got])(0)
        ref = torch.matmul(a[0], w[0].t()).float()
        err = float((got.float() - ref).abs().max() / ref.abs().max())
        return {"max_rel_err": err, "ok": err < GEMM_CHECK_TOL}


def feed_tile(name: str) -> tuple[int, int]:
    """Feed kernel ``name``'s tile (M x N outputs a CTA)."""
    return FEED_TILES.get(name, FEED_TILE)


def feed_symbol(name: str) -> str:
    """The kernel of feed kernel ``name`` in math_ceiling.cu."""
    return f"{name}_n{feed_tile(name)[1]}"


def runs_json(runs, flops: float, mon: Monitor) -> list[dict]:
    """Each run's record, its TFLOP/s and the monitor's summary of the run's second half
    (the settled state: NVML's power reading averages over up to a second)."""
    return [
        {
            **r.as_json(),
            "tflops": round(flops / r.us_per_call / 1e6, 2),
            **window(mon.samples, r.t0 + SETTLED * (r.t1 - r.t0), r.t1),
        }
        for r in runs
    ]


def measure_shape(
    m: int, n: int, k: int, mk: MathKernel, mon: Monitor, args, fk: FeedKernel | None = None
) -> dict:
    import torch

    from cudal2.bench.bench import make_operands
    from cudal2.records import Target
    from cudal2.verify.timing import operand_sets, time_sustained

    t = Target(arch="sm_90a", dtype="fp16", layout="tn", m=m, n=n, k=k)
    nsets = operand_sets(t.min_bytes)
    ops = make_operands(t, nsets, args.seed)
    w_t = [w.t() for w in ops.w_tn]
    flops = 2.0 * m * n * k
    rounds = mk.rounds_for(flops, "sms")
    fns = {
        "torch": lambda j: torch.matmul(ops.a[j], w_t[j], out=ops.c[j]),
        "math": mk.launcher("math_n256", "sms", "random", rounds),
    }
    checks = {}
    if fk is not None:
        for name in (x for x in args.feed if fk.fits(x, m, n, k)):
            checks[f"{name}_check"] = fk.verify(name, m, n, k, ops.a, ops.w_tn)
            fns[name] = fk.launcher(name, m, n, k, ops.a, ops.w_tn, ops.c)
    runs = time_sustained(fns, nsets, args.seconds, args.reps, args.seed)
    per_call = {name: flops for name in fns} | {"math": mk.flops(rounds, "sms")}
    rec = {
        "target": {"m": m, "n": n, "k": k, "dtype": "fp16", "layout": "tn"},
        "operand_sets": nsets,
        "math_rounds": rounds,
        "math_flops_per_call": mk.flops(rounds, "sms"),
        "runs": {name: runs_json(runs[name], per_call[name], mon) for name in fns},
    }
    rec.update(checks)
    return rec


def measure_variants(mk: MathKernel, mon: Monitor, args) -> dict:
    from cudal2.verify.timing import time_sustained

    flops = 2.0 * math.prod(VARIANT_SHAPE)
    fns, per_call = {}, {}
    for name, (kernel, grid, operands, _) in VARIANTS.items():
        rounds = mk.rounds_for(flops, grid)
        fns[name] = mk.launcher(kernel, grid, operands, rounds)
        per_call[name] = mk.flops(rounds, grid)
    runs = time_sustained(fns, 2, args.seconds, args.variant_reps, args.seed)
    return {
        name: {
            "label": label,
            "grid": mk.grid(grid),
            "kernel": kernel,
            "operands": operands,
            "runs": runs_json(runs[name], per_call[name], mon),
        }  # fmt: skip
        for name, (kernel, grid, operands, label) in VARIANTS.items()
    }


SMOKE_SHAPE = (4096, 4096, 4096)


def smoke(fk: FeedKernel | None, names: list[str], out: Path) -> int:
    """Each feed kernel once on SMOKE_SHAPE, checked first (the twins against torch, the
    feed kernels' count of k tiles), then ten launches timed with CUDA events: a quick
    look (run it under ``timeout``: a kernel whose barriers never complete hangs) before
    minutes of sustained runs."""
    import torch

    from cudal2.bench.bench import make_operands
    from cudal2.records import Target

    assert fk is not None  # main refuses --smoke without --feed
    m, n, k = SMOKE_SHAPE
    ops = make_operands(Target(arch="sm_90a", dtype="fp16", layout="tn", m=m, n=n, k=k), 1, 0)
    got: dict[str, dict] = {}
    for name in names:
        rec = fk.verify(name, m, n, k, ops.a, ops.w_tn)
        run = fk.launcher(name, m, n, k, ops.a, ops.w_tn, ops.c)
        run(0)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            run(0)
        end.record()
        end.synchronize()
        got[name] = {**rec, "us": round(start.elapsed_time(end) * 100, 1)}  # ms / 10 launches
        print(f"smoke {m}x{n}x{k} {name}: {got[name]}", flush=True)
    write_json(out, {"shape": list(SMOKE_SHAPE), "kernels": got})
    return 0 if all(r["ok"] for r in got.values()) else 1


def write_json(path: Path, d: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(d, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def summary_lines(res: dict) -> list[str]:
    out = []
    for s in res["shapes"]:
        t = s["target"]
        c = s.get("ceiling_speedup")
        feed = "".join(
            f"  {name} {s[name]['tflops']:7.1f} ({s.get(key, 0):.3f})"
            for name, key in FEED.items()
            if name in s
        )
        out.append(
            f"{t['m']:>5}x{t['n']}x{t['k']:<6} torch {s['torch']['tflops']:7.1f}  "
            f"math {s['math']['tflops']:7.1f} TFLOP/s  ceiling "
            + (f"{c:.3f}" if c is not None else "-")
            + feed
        )
    sm = res["summary"]
    out.append(
        f"{sm['shapes']} shapes: geomean ceiling {sm['geomean_ceiling']} x best vendor "
        f"({sm['geomean_ceiling_llm_public']} over the {sm['llm_public_shapes']} llm-public ones); "
        f"{sm['shapes_allowing_target']} allow 1.03"
    )
    out += [f"{key}: {sm[key]}" for key in FEED.values() if key in sm]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="bench/shapes/llm-public-prefill.toml")
    ap.add_argument("--bench", default="bench/results/h100-llm-public-prefill-v5.jsonl")
    ap.add_argument("--seconds", type=float, default=2.0, help="each sustained run lasts this long")
    ap.add_argument("--reps", type=int, default=3, help="sustained runs per callable and shape")
    ap.add_argument("--variant-reps", type=int, default=1)
    ap.add_argument(
        "--feed", nargs="?", const="feed,gemm", default="", metavar="KERNELS",
        help=f"add these feed kernels (comma-separated: {', '.join(FEED)})",
    )  # fmt: skip
    ap.add_argument("--no-variants", action="store_true", help="skip the short run and variants")
    ap.add_argument(
        "--smoke", action="store_true",
        help="only launch each --feed kernel on 4096^3 (twins checked), print its time, exit",
    )  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cubin", help="a compiled math_ceiling.cu (default: compile with nvcc)")
    ap.add_argument("--dry-run", metavar="RAW", help="analyse a recorded-format raw file (CPU)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        bench_rows = read_results(args.bench)
        if args.dry_run:
            raw = json.loads(Path(args.dry_run).read_text())
            res = analyse(raw, bench_rows, args.bench)
            write_json(out, res)
            print("\n".join(summary_lines(res)))
            return 0
        if args.seconds <= 0 or args.reps < 1 or args.variant_reps < 1:
            raise ValueError("--seconds must be > 0, --reps and --variant-reps >= 1")
        args.feed = [x for x in args.feed.split(",") if x]
        if bad := [x for x in args.feed if x not in FEED]:
            raise ValueError(f"--feed: unknown kernel {bad[0]!r} (known: {', '.join(FEED)})")
        if args.smoke and not args.feed:
            raise ValueError("--smoke launches the --feed kernels: name them")
        if shutil.which("nvidia-smi") is None:
            raise ValueError("nvidia-smi not found: the power limit and the samples need it")
    except (OSError, ValueError, KeyError) as e:
        print(f"math_ceiling: {e}", file=sys.stderr)
        return 2
    return measure(args, bench_rows, out)


def measure(args, bench_rows: list[dict], out: Path) -> int:
    import torch

    from cudal2.packaging.runtime import driver
    from cudal2.shapes import load_shapes

    index = torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    smi_index = int(visible.split(",")[index]) if visible.replace(",", "").isdigit() else index
    if args.cubin:
        cubin = Path(args.cubin).read_bytes()
    else:  # read_ceiling's nvcc call (this folder is on sys.path when run as a script)
        from read_ceiling import compile_cubin

        cubin = compile_cubin(HERE / "math_ceiling.cu")
    shapes = load_shapes(args.shapes)
    public = {s for s in load_shapes(PUBLIC_SHAPES) if s[0] >= 1024}
    sms = driver.sm_count(index)
    mk = MathKernel(cubin, sms)
    fk = FeedKernel(cubin, sms) if args.feed else None
    if args.smoke:
        return smoke(fk, args.feed, out)
    env = {**gpu_env(smi_index), "sm_count": sms, "seconds": args.seconds, "reps": args.reps}
    env.update(variant_reps=args.variant_reps, dry_run=False)
    kernel = {"source": "bench/experiments/math_ceiling.cu", "tile": [TILE_M, TILE_N, TILE_K]}
    kernel.update(ktiles_per_round=KTILES, threads=THREADS, flops_per_round_cta=FLOPS_PER_ROUND)
    if fk is not None:
        kernel["feed"] = {
            "threads": FEED_THREADS,
            "stages": FEED_STAGES,
            "group": FEED_GROUP,
            "grid": sms,
            "tile": [TILE_M, TILE_N, TILE_K],
            "tiles": {x: [*FEED_TILES[x], TILE_K] for x in args.feed if x in FEED_TILES},
            "kernels": args.feed,
        }
    raw = {
        "env": env,
        "kernel": kernel,
        "checks": [mk.check("math_n256"), mk.check("math_n128")],
        "fixed_us": round(mk.fixed_us(), 3),
        "shapes": [],
    }
    print(json.dumps(raw["env"]), "\nchecks:", raw["checks"], flush=True)
    print(f"a launch without wgmma: {raw['fixed_us']} us", flush=True)
    mon = Monitor(smi_index)
    raw["env"]["monitor"] = mon.source
    try:
        if not args.no_variants:
            raw["short"] = mk.short_run(SHORT_S, SHORT_IDLE_S)
            print("short run:", raw["short"], flush=True)
            raw["variants"] = measure_variants(mk, mon, args)
        order = list(shapes)
        random.Random(args.seed).shuffle(order)  # no shape always runs on a cold GPU
        for m, n, k in order:
            rec = measure_shape(m, n, k, mk, mon, args, fk)
            torch.cuda.empty_cache()  # this shape's operands, before the next one's
            rec["llm_public"] = (m, n, k) in public
            raw["shapes"].append(rec)
            raw["shapes"].sort(key=lambda r: shapes.index(tuple(r["target"][d] for d in "mnk")))
            write_json(out, analyse(raw, bench_rows, args.bench))
            one = analyse({**raw, "shapes": [rec]}, bench_rows, args.bench)
            print(summary_lines(one)[0], flush=True)
    finally:
        mon.stop()
    res = analyse(raw, bench_rows, args.bench)
    write_json(out, res)
    print("\n".join(summary_lines(res)))
    checks = raw["checks"] + [
        v for s in raw["shapes"] for k, v in s.items() if k.endswith("_check")
    ]
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
