"""A cubin's machine code (SASS) as text, through ``cuobjdump -sass``: to show that two
cubins run the same code, whatever their kernels are called.

cuobjdump and the nvdisasm it calls come with the CUDA toolkit, or as the pip packages
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` (the test extra installs them).
"""

from __future__ import annotations

import hashlib
import os
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
