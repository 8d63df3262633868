"""A cudal2 dispatch table, for benchmarking: the same table lookup and the same
driver launcher the shipped runtime uses, on operands the bench rotates. The table
comes from a wheel, a ``dispatch.json``, or a measurement database."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cudal2.packaging.runtime import cublaslt, driver
from cudal2.packaging.runtime.table import DispatchTable, TableEntry
from cudal2.packaging.table import read_table
from cudal2.records import GpuInfo, Target
from cudal2.verify.launch import dense_gemm


class WheelKernels:
    """A dispatch table and its cubins. ``open`` reads a wheel, a ``dispatch.json``
    beside its ``cubins/`` folder, a measurement database (``.jsonl`` or
    ``.jsonl.gz``), whose table is the one a build would select from it, or a
    manifest (``.toml``): the table its build would select from its database and the
    databases it reuses, for its targets."""

    def __init__(self, table: DispatchTable, cubins: dict[str, bytes], gpu: GpuInfo):
        self.cubins = cubins
        self.table = table
        self.gpu = gpu
        self.model, self.stand_in = self.table.resolve_gpu(gpu.name, gpu.arch)
        self._kernels: dict[str, driver.Kernel] = {}
        self._lt_handle: int | None = None
        self._keep: list[Any] = []  # cuBLASLt workspaces, alive as long as their launchers

    @classmethod
    def open(cls, path: str | Path, gpu: GpuInfo, mode: str = "offline") -> WheelKernels:
        path = Path(path)
        cubins: dict[str, bytes] = {}
        if path.suffix == ".whl":
            table = read_table(path)
            with zipfile.ZipFile(path) as z:
                for n in z.namelist():
                    if "/cubins/" in n and n.endswith(".cubin"):
                        cubins[Path(n).stem] = z.read(n)
        elif path.suffix == ".toml" or path.name.endswith((".jsonl", ".jsonl.gz")):
            table, cubins = _selected(path, mode)
        else:  # a dispatch.json beside its cubins/ folder
            table = read_table(path)
            for f in (path.parent / "cubins").glob("*.cubin"):
                cubins[f.stem] = f.read_bytes()
        return cls(table, cubins, gpu)

    def entry(self, t: Target) -> TableEntry | None:
        if self.model is None:
            return None
        return self.table.lookup(self.model, t.arch, t.dtype, t.layout, t.m, t.n, t.k)

    def describe(self, t: Target) -> dict[str, Any]:
        e = self.entry(t)
        if e is None:
            return {"kind": "fallback", "reason": "no entry"}
        return {
            "kind": e.kind,
            "kernel": e.kernel,
            "m_measured": e.m_measured,
            "table_gpu": e.gpu,
            "stand_in": self.stand_in,
        }

    def launcher(self, t: Target, a: list, w: list, c: list) -> Callable[[int], None]:
        """Operand set j -> what the entry dispatches: its kernel through the driver
        launcher, or its cuBLASLt algorithm through the runtime's cuBLASLt calls."""
        e = self.entry(t)
        assert e is not None and e.kind in ("kernel", "cublaslt")
        # One argument block per operand set, made before timing starts.
        gemms = [
            dense_gemm(t, a[j].data_ptr(), w[j].data_ptr(), c[j].data_ptr()) for j in range(len(a))
        ]
        if e.kind == "cublaslt":
            return self._cublaslt(e, t, gemms)
        sha = e.cubin_sha256
        if sha not in self._kernels:
            self._kernels[sha] = driver.Kernel(
                self.cubins[sha], e.symbol, e.launch["smem_bytes"], expected_sha256=sha
            )
        kernel, recipe = self._kernels[sha], e.launch

        def run(j: int) -> None:
            driver.launch_gemm(kernel, recipe, gemms[j], _stream())

        return run

    def _cublaslt(self, e: TableEntry, t: Target, gemms: list) -> Callable[[int], None]:
        import torch

        lt = e.cublaslt
        if cublaslt.version() != lt.version:
            raise RuntimeError(
                f"{e.key}: measured with cuBLASLt {lt.version}, this process has "
                f"{cublaslt.version()}: the bench would not time what the wheel runs"
            )
        if self._lt_handle is None:
            self._lt_handle = cublaslt.create_handle()
        gemm = cublaslt.LtGemm(self._lt_handle, bytes.fromhex(lt.algo), t.dtype, t.layout, gemms[0])
        ws = torch.empty(max(gemm.workspace_bytes, 1), dtype=torch.uint8, device="cuda")
        self._keep.append(ws)

        def run(j: int) -> None:
            gemm.run(gemms[j], ws.data_ptr(), ws.numel(), _stream())

        return run


def _stream() -> int:
    import torch

    return torch.cuda.current_stream().cuda_stream


def _selected(path: Path, mode: str) -> tuple[DispatchTable, dict[str, bytes]]:
    """The table a build without a GPU would select from a database, or from a
    manifest's database and the databases it reuses (its targets only), and the
    winners' cubins (compiled into the artifact cache)."""
    from cudal2.database import MeasurementDB, default_database
    from cudal2.generator.compile import ArtifactCache
    from cudal2.manifest import load_manifest
    from cudal2.pipeline.build import table_from_measurements

    targets = None
    if path.suffix == ".toml":
        manifest = load_manifest(path)
        db = MeasurementDB(default_database(path), manifest.reuse)
        targets = manifest.targets
    else:
        db = MeasurementDB(path)
    contents = db.load()
    if not contents.measurements:
        raise ValueError(f"{path}: no measurements")
    return table_from_measurements(
        contents.measurements, mode, ArtifactCache(), "bench", contents.checks, targets
    )
