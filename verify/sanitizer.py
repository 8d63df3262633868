"""compute-sanitizer memcheck of one kernel: every kernel that ships passes it.

The kernel runs once, in a child process under ``compute-sanitizer --tool memcheck``,
on a small problem that keeps the target's residues (M, N, K cut to at most 130, 136
and 264: none a multiple of a tile). Each operand (A, B, the epilogue's, C) is its own
``cuMemAlloc`` of exactly its size, so a read or write one element past the end of
any of them is caught.

The child needs no torch: its operands are a few hundred KiB, made on the host
(``host_operands``: uniform(-1, 1) in the working dtype, as the correctness trials')
and copied over. It used to import torch and let torch make them on the GPU: seconds
of import and CUDA start-up per kernel under the sanitizer, which instruments every
module loaded, for the same launch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal2.records import ROPE_KV, Target
from cudal2.verify import rope_kv
from cudal2.verify.gpu import visible_device


@dataclass(frozen=True)
class SanitizerResult:
    """``ok``, or the report that says why not (recorded with status ``sanitizer``)."""

    ok: bool
    report: str
    seconds: float = 0.0  # the compute-sanitizer run's wall time


def small(t: Target) -> Target:
    """The target cut to a small size that keeps its residues, its alignment and its
    epilogue (N stays even: a gated epilogue's pairs stay whole). Measured on the H100:
    cut to a plain target, a fused kernel's check launched it without its epilogue's
    arguments and every check failed. N keeps its residue modulo 16 past a 128-column
    tile: measured on the H200, the gated TMA store (its output's rows of N / 2, encoded
    in a tensor map, need 16 bytes: N % 16 == 0) cut to N = 136 could not encode C's
    map, and every such kernel failed its check."""
    if t.epilogue in ROPE_KV:  # N is the head split's (q + 2 kv) * head_dim
        return dataclasses.replace(t, m=min(t.m, 130), k=min(t.k, 264))
    n = t.n if t.n <= 144 else 128 + (t.n % 16 or 16)
    return dataclasses.replace(t, m=min(t.m, 130), n=n, k=min(t.k, 264))


def find_sanitizer() -> str | None:
    return shutil.which("compute-sanitizer") or next(
        (p for p in ("/usr/local/cuda/bin/compute-sanitizer",) if os.path.exists(p)), None
    )


def memcheck(
    cubin: Path,
    symbol: str,
    recipe: dict[str, Any],
    target: Target,
    timeout_s: float = 600,
    device: int | None = None,
) -> SanitizerResult:
    """The check, in a child process on CUDA device ``device`` of this process (None:
    the child sees what this process sees and runs on its device 0)."""
    tool = find_sanitizer()
    if tool is None:
        raise FileNotFoundError("compute-sanitizer not found (it ships with the CUDA toolkit)")
    job = {
        "cubin": str(cubin),
        "symbol": symbol,
        "recipe": recipe,
        "target": small(target).as_json(),
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")  # (should torch come back)
    if device is not None:  # the child sees that GPU alone, as its device 0
        env["CUDA_VISIBLE_DEVICES"] = visible_device(device)
    # API errors are not memory errors: cuda-python probes driver entry points that may
    # not exist (cuGetProcAddress), which memcheck would otherwise count.
    cmd = [
        tool,
        "--tool",
        "memcheck",
        "--report-api-errors",
        "no",
        "--error-exitcode",
        "86",
        "--print-limit",
        "10",
        sys.executable,
        "-m",
        "cudal2.verify.sanitizer",
        f.name,
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return SanitizerResult(False, f"memcheck timed out after {timeout_s:.0f} s", timeout_s)
    finally:
        os.unlink(f.name)
    seconds = round(time.perf_counter() - t0, 3)
    print(f"memcheck {symbol}: {seconds:.1f} s", file=sys.stderr, flush=True)
    text = (proc.stdout + proc.stderr)[-4000:]
    if proc.returncode == 0 and "ERROR SUMMARY: 0 errors" in text:
        return SanitizerResult(True, "", seconds)
    return SanitizerResult(False, f"memcheck exited {proc.returncode}:\n{text}", seconds)


def operand_shapes(t: Target) -> dict[str, tuple[int, ...]]:
    """The shapes the kernel reads its inputs in: ``a`` [M, K], ``b`` ([N, K] for tn,
    [K, N] for nn), and the epilogue's operands (``bias`` [N], ``residual`` [M, N])."""
    from cudal2.records import EPILOGUE_OPERANDS

    return {
        "a": (t.m, t.k),
        "b": (t.n, t.k) if t.layout == "tn" else (t.k, t.n),
        **{n: {"bias": (t.n,), "residual": (t.m, t.n)}[n] for n in EPILOGUE_OPERANDS[t.epilogue]},
        **(rope_kv.shapes(t) if t.epilogue in ROPE_KV else {}),
    }


def host_operands(t: Target, seed: int = 0, most: int | None = None) -> dict[str, Any]:
    """The launch's inputs on the host, as 16-bit patterns (numpy uint16) of the
    working dtype, shaped as the kernel reads them (``operand_shapes``; a gated
    epilogue's b scaled as in the trials). Uniform in (-1, 1). With ``most``, each is
    only its first ``most`` values, flat (the profiling child repeats them on the GPU)."""
    import numpy as np

    from cudal2.verify.correctness import gated_b_scale

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in operand_shapes(t).items():
        size = shape if most is None else (min(most, math.prod(shape)),)
        x = rng.uniform(-1.0, 1.0, size=size).astype(np.float32)
        if name == "b":
            x *= np.float32(gated_b_scale(t))
        out[name] = float_bits(x, t.dtype)
    return out


def float_bits(x, dtype: str):
    """float32 -> the 16-bit patterns of fp16 or bf16 (round to nearest even)."""
    import numpy as np

    if dtype == "fp16":
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # (no NaN here)


def _child(job_path: str) -> None:
    """Runs under compute-sanitizer: one launch of the kernel on fresh operands, each
    in an allocation of exactly its size, on the legacy default stream."""
    from cuda.bindings import driver as cu

    from cudal2.packaging.runtime import driver
    from cudal2.verify.launch import dense_epilogue, launch_dense

    job = json.loads(Path(job_path).read_text())
    t = Target.from_json(job["target"])
    driver.ensure_context(0)

    def ok(result: tuple, what: str):
        assert result[0] == cu.CUresult.CUDA_SUCCESS, f"{what}: {result[0]}"
        return result[1] if len(result) > 1 else None

    ptrs = {}
    for name, host in host_operands(t).items():
        ptrs[name] = ok(cu.cuMemAlloc(host.nbytes), f"cuMemAlloc({name})")
        ok(cu.cuMemcpyHtoD(ptrs[name], host, host.nbytes), f"cuMemcpyHtoD({name})")
    # The output: [M, out_n] (N/2 columns for a gated epilogue)
    c_ptr = ok(cu.cuMemAlloc(t.m * t.out_n * 2), "cuMemAlloc(c)")
    rope = None
    if t.epilogue in ROPE_KV:  # the int64 positions, then the operands' record
        host = rope_kv.host_positions(t)
        ptrs["positions"] = ok(cu.cuMemAlloc(host.nbytes), "cuMemAlloc(positions)")
        ok(cu.cuMemcpyHtoD(ptrs["positions"], host, host.nbytes), "cuMemcpyHtoD(positions)")
        ints = {n: int(p) for n, p in ptrs.items()}
        rope = rope_kv.contiguous_args(t, ints, ints["positions"])
    ops = dense_epilogue(t, int(ptrs.get("bias", 0)), int(ptrs.get("residual", 0)), rope)
    kernel = driver.Kernel(
        Path(job["cubin"]).read_bytes(), job["symbol"], job["recipe"]["smem_bytes"]
    )
    launch_dense(
        kernel, job["recipe"], t, int(ptrs["a"]), int(ptrs["b"]), int(c_ptr), 0, epilogue=ops
    )
    ok(cu.cuCtxSynchronize(), "cuCtxSynchronize")
    # The operands stay allocated until the launch has finished (a pointer to freed
    # memory is what memcheck reports): the process ends here.


if __name__ == "__main__":
    _child(sys.argv[1])
