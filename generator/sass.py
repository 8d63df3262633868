"""A cubin's machine code (SASS) as text, through ``cuobjdump -sass``: to show that two
cubins run the same code, whatever their kernels are called.

cuobjdump and the nvdisasm it calls come with the CUDA toolkit, or as the pip packages
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` (the test extra installs them).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

SYMBOL = "<symbol>"


class SassToolError(RuntimeError):
    """cuobjdump is missing or could not read the cubin."""


@cache
def tool_dir() -> Path | None:
    """The folder holding cuobjdump and nvdisasm: PATH first, then the pip packages."""
    found = shutil.which("cuobjdump")
    if found and shutil.which("nvdisasm"):
        return Path(found).parent
    for base in sys.path:
        d = Path(base) / "nvidia" / "cu13" / "bin"
        if (d / "cuobjdump").exists() and (d / "nvdisasm").exists():
            return d
    return None


def sass(cubin: bytes, symbol: str) -> str:
    """The SASS listing of ``cubin`` with the kernel's symbol replaced by a placeholder."""
    d = tool_dir()
    if d is None:
        raise SassToolError(
            "cuobjdump/nvdisasm not found (CUDA toolkit, or pip install nvidia-cuda-cuobjdump "
            "nvidia-cuda-nvdisasm)"
        )
    with tempfile.TemporaryDirectory(prefix="cudal2-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        env = {**os.environ, "PATH": f"{d}{os.pathsep}{os.environ.get('PATH', '')}"}
        proc = subprocess.run(
            [str(d / "cuobjdump"), "-sass", str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    if proc.returncode != 0 or "Function" not in proc.stdout:
        raise SassToolError(f"cuobjdump -sass failed: {proc.stderr.strip()[-500:]}")
    return proc.stdout.replace(symbol, SYMBOL)


def sass_sha256(cubin: bytes, symbol: str) -> str:
    """A digest of ``sass(cubin, symbol)``: equal for cubins of the same machine code."""
    return hashlib.sha256(sass(cubin, symbol).encode()).hexdigest()


# PDL in SASS: griddepcontrol.wait is ACQBULK, griddepcontrol.launch_dependents is
# PREEXIT (an L2 prefetch is CCTL, allowed before the wait). The opcodes that touch
# global memory (or may: generic LD/ST/ATOM), none of which may come before the wait.
PDL_WAIT_OP = "ACQBULK"
PDL_TRIGGER_OP = "PREEXIT"
GLOBAL_MEMORY_OPS = frozenset(
    {"LDG", "STG", "LDGSTS", "UBLKCP", "UTMALDG", "UTMASTG", "UTMAREDG", "ATOMG", "REDG",
     "RED", "ATOM", "LD", "ST", "SULD", "SUST"}
)  # fmt: skip
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")


def opcodes(listing: str) -> list[tuple[int, str]]:
    """(address, opcode without modifiers) of every instruction of a SASS listing."""
    return [(int(a, 16), op) for a, op in _INSTRUCTION.findall(listing)]


def pdl_violations(listing: str, trigger: str) -> list[str]:
    """What is wrong with a kernel's SASS for PDL trigger ``trigger`` (``none``: no
    griddepcontrol at all): every global memory instruction placed before the first
    griddepcontrol.wait, a missing wait or trigger, a trigger on the wrong side of the
    wait (``entry`` before it, the others after). Text order is the order checked: the
    wait stands at the top level of every kernel, so every memory access it must
    precede follows it in the listing."""
    ops = opcodes(listing)
    waits = [a for a, op in ops if op == PDL_WAIT_OP]
    triggers = [a for a, op in ops if op == PDL_TRIGGER_OP]
    if trigger == "none":
        return [f"{op} in a plain design" for op in (PDL_WAIT_OP, PDL_TRIGGER_OP) if op in
                {o for _, o in ops}]  # fmt: skip
    out: list[str] = []
    if not waits:
        return [f"no {PDL_WAIT_OP} (griddepcontrol.wait)"]
    first_wait = min(waits)
    out += [f"{op} at {a:#06x} before {PDL_WAIT_OP} at {first_wait:#06x}" for a, op in ops
            if op in GLOBAL_MEMORY_OPS and a < first_wait]  # fmt: skip
    if not triggers:
        out.append(f"no {PDL_TRIGGER_OP} (griddepcontrol.launch_dependents)")
    elif (min(triggers) < first_wait) != (trigger == "entry"):
        side = "before" if trigger == "entry" else "after"
        out.append(f"trigger {trigger!r}: {PDL_TRIGGER_OP} is not {side} {PDL_WAIT_OP}")
    return out
