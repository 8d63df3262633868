"""The Nsight Compute child without torch (issue 23: its import was ~4 s of each
round's ~12 s of profiling on the H100): its operands are the memcheck child's uniform
values, a block of them drawn on the host and repeated on the GPU by doubling copies.
What only the H100 shows: the launches under ncu and the metrics they give."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import numpy as np
import pytest

from cudal2.records import Target
from cudal2.verify import profile, sanitizer


class FakeDriver:
    """The three driver calls ``fill_repeated`` makes, on a bytearray as device memory."""

    def __init__(self, nbytes: int) -> None:
        from cuda.bindings import driver

        self.ok = driver.CUresult.CUDA_SUCCESS
        self.mem = bytearray(nbytes)
        self.calls: list[str] = []

    def cuMemcpyHtoD(self, dst: int, src, n: int):  # noqa: N802 (the driver's name)
        self.mem[dst : dst + n] = src.tobytes()[:n]
        self.calls.append("HtoD")
        return (self.ok,)

    def cuMemcpyDtoD(self, dst: int, src: int, n: int):  # noqa: N802
        assert src + n <= dst, "a copy reads only what is filled, never what it writes"
        self.mem[dst : dst + n] = self.mem[src : src + n]
        self.calls.append("DtoD")
        return (self.ok,)


@pytest.mark.parametrize(
    "values,total",
    [
        (8, 8),  # the block is the whole buffer
        (8, 16),  # twice
        (8, 7 * 8),  # not a power of two of blocks
        (8, 8 * 8 + 3),  # a partial block at the end
        (1 << 19, 14336 * 4096),  # a llama gate_up weight's half
        (3, 1),  # a buffer smaller than the block (never asked: the block is cut to it)
    ],
)
def test_fill_repeated_writes_the_block_over_the_buffer(values, total):
    block = np.arange(1, values + 1, dtype=np.uint16)
    nbytes = 2 * total
    fake = FakeDriver(nbytes + 64)
    copies = profile.fill_repeated(fake, 32, nbytes, block)
    want = np.resize(block, total).tobytes()
    assert bytes(fake.mem[32 : 32 + nbytes]) == want
    assert not any(fake.mem[:32]) and not any(fake.mem[32 + nbytes :])  # nothing outside
    assert fake.calls[0] == "HtoD" and fake.calls.count("HtoD") == 1
    assert len(copies) <= 2 + max(total // values, 1).bit_length()  # doubling: log copies


@pytest.mark.parametrize(
    "target",
    [
        Target("sm_90a", "fp16", "tn", 16, 40, 96, epilogue="bias_residual"),
        Target("sm_90a", "bf16", "nn", 7, 24, 40),
    ],
    ids=lambda t: t.label,
)
def test_a_small_targets_operands_are_the_memcheck_childs(target):
    """Below the block, the child's operands are exactly the memcheck child's."""
    got = sanitizer.host_operands(target, most=profile.OPERAND_BLOCK)
    full = sanitizer.host_operands(target)
    assert set(got) == set(full)
    for name, bits in full.items():
        assert (got[name] == bits.ravel()).all(), name


def test_a_large_targets_operands_are_a_block_of_the_same_values():
    t = Target("sm_90a", "fp16", "tn", 64, 14336, 4096)  # B: 58.7 M values
    got = sanitizer.host_operands(t, most=profile.OPERAND_BLOCK)
    assert got["a"].size == 64 * 4096 and got["b"].size == profile.OPERAND_BLOCK
    assert (got["a"] == sanitizer.host_operands(t)["a"].ravel()).all()
    b = got["b"].view(np.float16).astype(np.float32)
    assert np.isfinite(b).all() and np.abs(b).max() <= 1.0 and b.std() > 0.5


def test_the_child_imports_no_torch_and_fails_at_the_driver_here(tmp_path):
    """Run as ncu runs it, with ``import torch`` made to fail: on this machine (no
    driver) it must get as far as the CUDA driver, never needing torch."""
    jobs = tmp_path / "jobs.json"
    t = Target("sm_90a", "fp16", "tn", 16, 64, 64)
    jobs.write_text(
        json.dumps([{"cubin": "x", "symbol": "s", "recipe": {}, "target": t.as_json()}])
    )
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is not to be imported here')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from cudal2.verify.profile import _child\n"
        f"_child({str(jobs)!r}, {str(tmp_path / 'phases.json')!r})\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode != 0
    assert "torch is not to be imported" not in run.stderr, run.stderr[-2000:]
    assert "driver" in run.stderr.lower(), run.stderr[-2000:]
    assert "torch" not in inspect.getsource(profile._child)
