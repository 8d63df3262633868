"""compute-sanitizer memcheck of one kernel: every kernel that ships passes it.

The kernel runs once, in a child process under ``compute-sanitizer --tool memcheck``,
on a small problem that keeps the target's residues (M, N, K cut to at most 130, 136
and 264: none a multiple of a tile). PyTorch's caching allocator is off there, so
each operand is its own allocation and a write one element past the end is caught.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudal2.records import Target
from cudal2.verify.gpu import visible_device


@dataclass(frozen=True)
class SanitizerResult:
    """``ok``, or the report that says why not (recorded with status ``sanitizer``)."""

    ok: bool
    report: str


def small(t: Target) -> Target:
    """The target cut to a small size that keeps its residues, its alignment and its
    epilogue (N stays even: a gated epilogue's pairs stay whole). Measured on the H100:
    cut to a plain target, a fused kernel's check launched it without its epilogue's
    arguments and every check failed."""
    return dataclasses.replace(t, m=min(t.m, 130), n=min(t.n, 136), k=min(t.k, 264))


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
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
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
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return SanitizerResult(False, f"memcheck timed out after {timeout_s:.0f} s")
    finally:
        os.unlink(f.name)
    text = (proc.stdout + proc.stderr)[-4000:]
    if proc.returncode == 0 and "ERROR SUMMARY: 0 errors" in text:
        return SanitizerResult(True, "")
    return SanitizerResult(False, f"memcheck exited {proc.returncode}:\n{text}")


def _child(job_path: str) -> None:
    """Runs under compute-sanitizer: one launch of the kernel on fresh operands."""
    import torch
    from cuda.bindings import driver as cu

    from cudal2.packaging.runtime import driver
    from cudal2.verify.correctness import epilogue_operands, operands
    from cudal2.verify.launch import dense_epilogue, launch_dense

    job = json.loads(Path(job_path).read_text())
    t = Target.from_json(job["target"])
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    a, b = operands(t, "random", gen)
    # The epilogue's operands stay referenced until the launch has finished: a pointer
    # to a freed tensor is what memcheck reports (it did, on the H100, for every fused
    # bias and residual kernel while only the pointers were kept).
    epi_tensors = epilogue_operands(t, "random", gen)
    epi = {name: x.data_ptr() for name, x in epi_tensors.items()}
    ops = dense_epilogue(t, epi.get("bias", 0), epi.get("residual", 0))
    # The output ([M, out_n]: N/2 columns for a gated epilogue) gets an allocation of
    # exactly its size (torch may round sizes up, and memcheck only sees writes past
    # what was asked for).
    err, c_ptr = cu.cuMemAlloc(t.m * t.out_n * a.element_size())
    assert err == cu.CUresult.CUDA_SUCCESS, err
    kernel = driver.Kernel(
        Path(job["cubin"]).read_bytes(), job["symbol"], job["recipe"]["smem_bytes"]
    )
    stream = torch.cuda.current_stream().cuda_stream
    launch_dense(
        kernel, job["recipe"], t, a.data_ptr(), b.data_ptr(), int(c_ptr), stream, epilogue=ops
    )
    torch.cuda.synchronize()
    del epi_tensors  # only now


if __name__ == "__main__":
    _child(sys.argv[1])
