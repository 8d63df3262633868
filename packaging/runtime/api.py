"""The torch API of a generated kernel package: ``bind(package) -> Api``.

``Api.matmul(a, b)`` and ``Api.linear(x, w)`` run a measured kernel (or the cuBLASLt
algorithm the build autotuned, entries of kind ``cublaslt``) where the dispatch table
has one for the shape and the inputs meet the ABI ``gemm_v1`` (docs/contracts.md),
and otherwise return exactly what torch returns: a fallback is never a wrong answer,
only a slower one.

Self-contained (ships inside wheels as ``_runtime``): imports the standard library
and its own files only. ``torch`` and ``cuda.bindings`` are imported at the first
call, so importing this module or calling ``bind`` touches no CUDA and needs no torch.
"""

from __future__ import annotations

import importlib.resources
import json
import threading
import warnings
from collections import Counter
from typing import Any

from . import arrays, cublaslt, driver
from .abi import abi_reason, disabled
from .table import DispatchTable, entry_key

_READY_MAX = 1 << 16  # shapes remembered as ready to launch (a few MB at most)

_torch: Any = None  # the torch module, once imported
_DTYPE_NAMES: dict[Any, str] = {}  # torch dtype -> table dtype
_PLAIN_TYPES: tuple[type, ...] = ()  # tensor types that are safe to hand to a kernel
_raw_stream: Any = None  # device index -> current cudaStream_t, the cheapest way available


def _import_torch() -> Any:
    """Import torch on first use and cache what the hot path needs from it."""
    global _torch, _DTYPE_NAMES, _PLAIN_TYPES, _raw_stream
    if _torch is None:
        import torch

        _DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
        _PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)
        # Private but long-lived (TorchInductor calls it for every launch); it skips
        # building a torch.cuda.Stream object. The public spelling is the fallback.
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _raw_stream = raw or (lambda dev: torch.cuda.current_stream(dev).cuda_stream)
        _torch = torch
    return _torch


class Stats:
    """Counters of one ``Api``.

    ``hits[entry key]`` counts kernel launches per table entry (``table.entry_key``);
    ``fallbacks[reason]`` counts calls served by torch, by the first reason found:
    ``disabled`` (CUDAL2_DISABLE=1), ``tensor_type`` (not a plain tensor), ``compiling``
    (torch.compile tracing), ``rank``, ``not_strided``, ``dtype`` (not fp16/bf16 or
    mixed), ``grad`` (autograd would need a backward; the torch op has one), ``bias``
    (not an [N] tensor of the input's dtype and device), ``shape`` (mismatch: torch
    raises), ``empty``, ``stride`` (inner stride, leading dim or view rules),
    ``alignment`` (pointer not 16-byte aligned), ``device`` (not one CUDA device),
    ``arch``, ``driver``, ``gpu``, ``no_entry``, ``fallback_entry`` (the table chose
    the baseline), ``align`` (the recipe's dims), ``fits`` (grid or int limits),
    ``abi`` (a launch ABI this runtime does not know), ``capture`` (kernel not loaded
    during graph capture), ``load_error``, ``launch_error``; for cuBLASLt entries
    ``cublaslt_missing`` (nvmath-python not importable), ``cublaslt_version`` (another
    cuBLASLt than the one the algorithm was measured with), ``cublaslt_algo``
    (cublasLtMatmulAlgoCheck refuses this shape or wants more workspace).

    Updates are not locked: concurrent calls from several threads may miss a count.
    """

    def __init__(self) -> None:
        self.hits: Counter[str] = Counter()
        self.fallbacks: Counter[str] = Counter()

    def reset(self) -> None:
        """Zero every counter."""
        self.hits.clear()
        self.fallbacks.clear()

    def as_dict(self) -> dict[str, dict[str, int]]:
        """A JSON-ready copy of the counters."""
        return {"hits": dict(self.hits), "fallbacks": dict(self.fallbacks)}

    def __repr__(self) -> str:
        return f"Stats(hits={dict(self.hits)}, fallbacks={dict(self.fallbacks)})"


class _Device:
    """What the first use of one device found out, kept for every later call."""

    __slots__ = ("arch", "gpu", "reason")

    def __init__(self, gpu: str | None, arch: str | None, reason: str | None):
        self.gpu = gpu  # the table's model serving this device (maybe a stand-in)
        self.arch = arch
        self.reason = reason  # a fallback reason for every call, or None


class _Plan:
    """How to run one table entry: its recipe and kernel (kind ``kernel``) or its
    cuBLASLt algorithm (kind ``cublaslt``), and where it is loaded."""

    __slots__ = (
        "align",
        "dtype",
        "gemms",
        "kernel",
        "key",
        "layout",
        "loaded",
        "lt",
        "reason",
        "recipe",
    )

    def __init__(self, entry: dict[str, Any]):
        self.key = entry_key(entry)
        self.dtype: str = entry["dtype"]
        self.layout: str = entry["layout"]
        kind = entry.get("kind")
        self.recipe: dict[str, Any] = entry.get("launch") or {}
        # (index into (m, n, k), required multiple), checked on every call
        dims = {"m": 0, "n": 1, "k": 2}
        self.align = tuple(
            (dims[d], int(v)) for d, v in (self.recipe.get("align") or {}).items() if int(v) > 1
        )
        self.kernel: driver.Kernel | None = None
        self.loaded: set[int] = set()  # device indices where the kernel (or cuBLASLt) is ready
        self.lt: dict[str, Any] | None = entry.get("cublaslt") if kind == "cublaslt" else None
        # (device, m, n, k, lda, ldb) -> the cuBLASLt call checked for that shape
        self.gemms: dict[tuple, cublaslt.LtGemm] = {}
        self.reason: str | None = None if kind in ("kernel", "cublaslt") else "fallback_entry"
        if kind == "kernel" and self.recipe.get("abi", "gemm_v1") not in driver.ABIS:
            self.reason = "abi"  # a kernel of a newer runtime's ABI


def _row_stride(shape: Any, strides: Any, k: int) -> int:
    """Row stride of the [M, K] matrix that a [..., K] tensor's leading dims collapse
    into without a copy, or -1 when they don't. Size-1 dims are skipped: their stride
    carries no meaning (torch may report anything), and an all-1 prefix means M == 1,
    whose row stride is then K, as in a contiguous [1, K] tensor."""
    ld = -1
    rows = 1
    for size, stride in zip(reversed(shape[:-1]), reversed(strides[:-1]), strict=True):
        if size == 1:
            continue
        if ld < 0:
            ld = stride
        elif stride != ld * rows:
            return -1
        rows *= size
    return k if ld < 0 else ld


def _common_checks(torch: Any, a: Any, b: Any, in_op: bool = False) -> str | None:
    """Checks shared by matmul and linear, cheapest first; a fallback reason or None.
    ``in_op``: called as the torch op's CPU/CUDA kernel. The dispatcher has already
    handled tensor subclasses that dispatch in Python (FakeTensor, DTensor, ...), so
    any tensor is plain data here (e.g. vLLM's ``Parameter`` subclasses, whose
    ``__torch_function__`` only passes through); and the op's registered backward takes
    care of autograd, so inputs that require grad may run a kernel."""
    if disabled():
        return "disabled"
    if not in_op and (type(a) not in _PLAIN_TYPES or type(b) not in _PLAIN_TYPES):
        # Non-tensors make torch raise; subclasses (FakeTensor, DTensor, ...) dispatch
        # through __torch_function__, and only torch knows what their data pointer means.
        return "tensor_type"
    if torch.compiler.is_compiling():
        return "compiling"
    if a.layout is not torch.strided or b.layout is not torch.strided:
        return "not_strided"  # sparse tensors have no strides
    dtype = a.dtype
    if dtype is not b.dtype or dtype not in _DTYPE_NAMES:
        return "dtype"
    if not in_op and (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        return "grad"
    return None


# A GEMM ready for the table: (dtype, layout, a, b, m, n, k, lda, ldb).
_Gemm = tuple[str, str, Any, Any, int, int, int, int, int]


def _matmul_operands(torch: Any, a: Any, b: Any, in_op: bool = False) -> _Gemm | str:
    """Classify ``torch.matmul(a, b)`` as a gemm_v1 GEMM, or give a fallback reason."""
    reason = _common_checks(torch, a, b, in_op)
    if reason is not None:
        return reason
    shape_a, shape_b = a.shape, b.shape
    if len(shape_a) != 2 or len(shape_b) != 2:
        return "rank"
    m, k = shape_a
    kb, n = shape_b
    if k != kb:
        return "shape"
    if m == 0 or n == 0 or k == 0:
        return "empty"
    sb0, sb1 = b.stride()
    if sb1 == 1 and sb0 >= n:
        layout, ldb = "nn", sb0  # row-major [K, N]
    elif sb0 == 1 and sb1 >= k:
        layout, ldb = "tn", sb1  # the transpose view of a row-major [N, K]
    else:
        return "stride"
    return _finish(layout, a, b, shape_a, m, n, k, ldb)


def _linear_operands(
    torch: Any, x: Any, w: Any, bias: Any = None, in_op: bool = False
) -> _Gemm | str:
    """Classify ``F.linear(x, w, bias)`` (x [..., K], w [N, K], bias [N] or None) as a
    tn GEMM (the bias added to its output after), or give a fallback reason."""
    reason = _common_checks(torch, x, w, in_op)
    if reason is not None:
        return reason
    if bias is not None and (
        (not in_op and type(bias) not in _PLAIN_TYPES)
        or bias.dtype is not x.dtype
        or bias.dim() != 1
        or bias.shape[0] != w.shape[0]
        or bias.device != x.device
        or (not in_op and bias.requires_grad and torch.is_grad_enabled())
    ):
        return "bias"
    shape_x, shape_w = x.shape, w.shape
    if not shape_x or len(shape_w) != 2:
        return "rank"
    k = shape_x[-1]
    n, kw = shape_w
    if k != kw:
        return "shape"
    m = x.numel() // k if k else 0
    if m == 0 or n == 0:
        return "empty"
    sw0, sw1 = w.stride()
    if sw1 != 1 or sw0 < k:
        return "stride"
    return _finish("tn", x, w, shape_x, m, n, k, sw0)


def _finish(
    layout: str, a: Any, b: Any, shape_a: Any, m: int, n: int, k: int, ldb: int
) -> _Gemm | str:
    """Checks on A, the leading dims and the pointers common to both layouts."""
    strides_a = a.stride()
    if strides_a[-1] != 1:
        return "stride"
    lda = _row_stride(shape_a, strides_a, k)
    reason = abi_reason(lda, ldb, n, k, a.data_ptr(), b.data_ptr())
    if reason is not None:
        return reason
    return (_DTYPE_NAMES[a.dtype], layout, a, b, m, n, k, lda, ldb)


def dtype_name(dtype: Any) -> str | None:
    """The table's name of a torch dtype ("fp16", "bf16"), or None."""
    _torch or _import_torch()
    return _DTYPE_NAMES.get(dtype)


class Api:
    """Matmul and linear of one generated package, with its table, kernels and stats.

    Created by ``bind``; reads nothing until first used. Thread-safe: first-use work
    (table, device checks, kernel loads) happens under a lock; calls are otherwise
    lock-free.
    """

    def __init__(self, package: str):
        self.package = package
        self.stats = Stats()
        self._table: DispatchTable | None = None
        self._lock = threading.RLock()
        self._devices: dict[int, _Device] = {}
        self._plans: dict[int, _Plan] = {}  # id(entry) -> plan; the table keeps entries alive
        self._kernels: dict[tuple[str, str], driver.Kernel] = {}
        # (device, dtype, layout, m, n, k) -> a plan that passed every check there
        self._ready: dict[tuple, _Plan] = {}
        self._warned: set[str] = set()
        self._lt_handles: dict[int, int] = {}  # device -> cuBLASLt handle
        self._lt_workspaces: dict[tuple[int, int], Any] = {}  # (device, stream) -> workspace
        self._driver_reason: str | None = None
        self._driver_checked = False
        self._covered: set[tuple[str, str, int, int]] | None = None

    def __repr__(self) -> str:
        return f"Api({self.package!r})"

    @property
    def table(self) -> DispatchTable:
        """The package's dispatch table (``dispatch.json``, read on first access)."""
        table = self._table
        if table is None:
            with self._lock:
                if self._table is None:
                    text = importlib.resources.files(self.package).joinpath("dispatch.json")
                    self._table = DispatchTable.from_json(json.loads(text.read_text("utf-8")))
                table = self._table
        return table

    def matmul(self, a: Any, b: Any) -> Any:
        """``torch.matmul(a, b)``; 2-D a [M, K] with b row-major [K, N] (layout nn) or
        b the transpose view of a row-major [N, K] (layout tn) may run a kernel.
        CuPy and other DLPack / CUDA-array-interface arrays go through ``arrays``
        (no torch needed; a CuPy array back)."""
        if (_torch is None or type(a) not in _PLAIN_TYPES) and arrays.is_foreign(a):
            return arrays.run(self, "matmul", a, b)
        return self._matmul(a, b, False)

    def linear(self, x: Any, w: Any, bias: Any = None) -> Any:
        """``torch.nn.functional.linear(x, w, bias)``: x [..., K], w [N, K] -> [..., N],
        as layout tn with M = the product of x's leading dims; a bias [N] is added to
        the kernel's output after it (no kernel fuses it yet). Other arrays: as
        ``matmul``."""
        if (_torch is None or type(x) not in _PLAIN_TYPES) and arrays.is_foreign(x):
            return arrays.run(self, "linear", x, w, bias)
        return self._linear(x, w, bias, False)

    def op_matmul(self, a: Any, b: Any) -> Any:
        """``matmul`` as the torch op's kernel (``_common_checks``' ``in_op``)."""
        return self._matmul(a, b, True)

    def op_linear(self, x: Any, w: Any, bias: Any = None) -> Any:
        """``linear`` as the torch op's kernel (``_common_checks``' ``in_op``)."""
        return self._linear(x, w, bias, True)

    def _matmul(self, a: Any, b: Any, in_op: bool) -> Any:
        torch = _torch or _import_torch()
        gemm = _matmul_operands(torch, a, b, in_op)
        if type(gemm) is tuple:
            out = self._run(torch, gemm)
            if type(out) is not str:
                return out
            gemm = out
        self.stats.fallbacks[gemm] += 1
        return torch.matmul(a, b)

    def _linear(self, x: Any, w: Any, bias: Any, in_op: bool) -> Any:
        torch = _torch or _import_torch()
        gemm = _linear_operands(torch, x, w, bias, in_op)
        if type(gemm) is tuple:
            out = self._run(torch, gemm)
            if type(out) is not str:
                if bias is not None:
                    out.add_(bias)
                return out if x.dim() == 2 else out.view(*x.shape[:-1], gemm[5])
            gemm = out
        self.stats.fallbacks[gemm] += 1
        return torch.nn.functional.linear(x, w, bias)

    def covers(self, n: int, k: int, dtype: str, layout: str = "tn") -> bool:
        """Whether the table has a kernel or cuBLASLt entry for (dtype, layout, N, K) on
        any of its GPU models (the op still checks the GPU at each call)."""
        covered = self._covered
        if covered is None:
            covered = {
                (e["dtype"], e["layout"], e["n"], e["k"])
                for e in self.table.entries
                if e.get("kind") in ("kernel", "cublaslt")
            }
            self._covered = covered
        return (dtype, layout, n, k) in covered

    def warmup(self, device: int | None = None) -> int:
        """Load every kernel of the table for ``device`` (default: the current one),
        and ready its cuBLASLt entries (library, handle, the current stream's
        workspace), so that a CUDA-graph capture later loads nothing. Returns how many
        table entries are ready there; 0 when the device cannot use the table, or when
        there is no CUDA at all (so calling it at start-up is safe)."""
        torch = _torch or _import_torch()
        if not torch.cuda.is_available():
            return 0
        dev = torch.cuda.current_device() if device is None else int(device)
        info = self._devices.get(dev) or self._device_info(torch, dev)
        if info.reason is not None:
            return 0
        loaded = 0
        for entry in self.table.entries_for(info.gpu, info.arch):
            plan = self._plans.get(id(entry)) or self._plan(entry)
            load = self._load if plan.lt is None else self._load_cublaslt
            if plan.reason is None and (dev in plan.loaded or load(torch, plan, dev) is None):
                loaded += 1
                if plan.lt is not None:  # the current stream's workspace too
                    self._lt_workspace(torch, dev, _raw_stream(dev))
        return loaded

    # -- the dispatch path -------------------------------------------------------

    def _run(self, torch: Any, gemm: _Gemm) -> Any:
        """Launch the table's kernel for ``gemm``; the [M, N] output, or a reason."""
        dtype, layout, a, b, m, n, k, lda, ldb = gemm
        if not (a.is_cuda and b.is_cuda):
            return "device"
        dev = a.get_device()
        if b.get_device() != dev:
            return "device"
        return self._dispatch(
            torch,
            (dev, dtype, layout, m, n, k),
            a.data_ptr(),
            b.data_ptr(),
            lda,
            ldb,
            lambda: torch.empty((m, n), dtype=a.dtype, device=a.device),
            _raw_stream,
        )

    def _dispatch(
        self,
        be: Any,
        shape: tuple,
        a_ptr: int,
        b_ptr: int,
        lda: int,
        ldb: int,
        alloc: Any,
        stream_of: Any,
    ) -> Any:
        """Run the plan for ``shape`` = (device, dtype, layout, m, n, k) on operands at
        ``a_ptr`` / ``b_ptr``: the output ``alloc()`` made, or a fallback reason. ``be``
        is torch, or the CuPy stand-in of ``arrays``; ``stream_of(device)`` the
        caller's current stream there."""
        plan = self._ready.get(shape)
        if plan is None or plan.reason is not None:
            plan = self._prepare(be, shape)
            if type(plan) is str:
                return plan
        dev, _, _, m, n, k = shape
        c = alloc()
        try:
            if be.cuda.current_device() == dev:
                reason = self._launch(
                    be, plan, a_ptr, b_ptr, c.data_ptr(), shape, lda, ldb, stream_of
                )
            else:
                # The driver launches in the current context: make it the device's.
                with be.cuda.device(dev):
                    reason = self._launch(
                        be, plan, a_ptr, b_ptr, c.data_ptr(), shape, lda, ldb, stream_of
                    )
        except (driver.CudaDriverError, cublaslt.LtError) as exc:
            plan.reason = "launch_error"
            self._warn_once(
                f"launch:{plan.key}",
                f"{self.package}: launching {plan.key} failed ({exc}); using the fallback for it",
            )
            return "launch_error"
        if reason is not None:
            return reason
        self.stats.hits[plan.key] += 1
        return c

    def _prepare(self, torch: Any, shape: tuple) -> _Plan | str:
        """The plan for (device, dtype, layout, m, n, k), loaded on the device and
        remembered so the next call of this shape skips every check below; or a
        fallback reason."""
        dev, dtype, layout, m, n, k = shape
        info = self._devices.get(dev) or self._device_info(torch, dev)
        if info.reason is not None:
            return info.reason
        entry = self.table.lookup_exact(info.gpu, info.arch, dtype, layout, m, n, k)
        if entry is None:
            return "no_entry"
        plan = self._plans.get(id(entry)) or self._plan(entry)
        if plan.reason is not None:
            return plan.reason
        mnk = (m, n, k)
        for dim, multiple in plan.align:
            if mnk[dim] % multiple:
                return "align"
        if plan.lt is None and not driver.gemm_fits(plan.recipe, m, n, k):
            return "fits"
        if dev not in plan.loaded:
            load = self._load if plan.lt is None else self._load_cublaslt
            reason = load(torch, plan, dev)
            if reason is not None:
                return reason
        if len(self._ready) >= _READY_MAX:
            self._ready.clear()  # many distinct M values: start over rather than grow
        self._ready[shape] = plan
        return plan

    def _launch(
        self,
        be: Any,
        plan: _Plan,
        a_ptr: int,
        b_ptr: int,
        c_ptr: int,
        shape: tuple,
        lda: int,
        ldb: int,
        stream_of: Any,
    ) -> str | None:
        """Queue the plan's kernel (or cuBLASLt algorithm) on the caller's current
        stream, never synchronising: ordering is the stream's. A fallback reason when
        cuBLASLt refuses this shape (checked once per shape and leading dims)."""
        dev, _, _, m, n, k = shape
        stream = stream_of(dev)
        if plan.lt is None:
            driver.launch_gemm(
                plan.kernel,
                plan.recipe,
                a_ptr,
                b_ptr,
                c_ptr,
                m,
                n,
                k,
                lda,
                ldb,
                n,
                stream=stream,
                device=dev,
            )
            return None
        gemm = plan.gemms.get((dev, m, n, k, lda, ldb))
        if gemm is None:
            gemm = self._lt_gemm(plan, dev, m, n, k, lda, ldb)
            if type(gemm) is str:
                return gemm
        ws = self._lt_workspaces.get((dev, stream))
        if ws is None:
            ws = self._lt_workspace(be, dev, stream)
        if gemm.workspace_bytes > ws.numel():
            return "cublaslt_algo"
        gemm.run(a_ptr, b_ptr, c_ptr, ws.data_ptr(), ws.numel(), stream)
        return None

    # -- first-use work (under the lock, off the hot path) -----------------------

    def _load_cublaslt(self, torch: Any, plan: _Plan, dev: int) -> str | None:
        """Ready a cuBLASLt entry on ``dev``: the bindings import, the library is the
        version the algorithm was measured with, a handle exists for the device."""
        if torch.cuda.is_current_stream_capturing():
            self._warn_once(
                "capture",
                f"{self.package}: a CUDA graph is being captured and {plan.key} is not "
                "ready yet; using torch for it. Call warmup() before capturing.",
            )
            return "capture"
        with self._lock:
            if dev in plan.loaded:
                return None
            try:
                have = cublaslt.version()
            except Exception as exc:  # noqa: BLE001 - not installed, or cannot load the library
                self._warn_once(
                    "cublaslt_missing",
                    f"{self.package}: cannot load cuBLASLt through nvmath-python ({exc}); "
                    "using torch where the table picked a cuBLASLt algorithm "
                    "(pip install nvmath-python)",
                )
                return "cublaslt_missing"
            want = int(plan.lt["version"])
            if have != want:
                self._warn_once(
                    f"cublaslt_version:{want}",
                    f"{self.package}: the table's cuBLASLt algorithms were measured with "
                    f"cuBLASLt {want}, this process loads {have}; using torch for them",
                )
                return "cublaslt_version"
            if dev not in self._lt_handles:
                with torch.cuda.device(dev):
                    self._lt_handles[dev] = cublaslt.create_handle()
            plan.loaded.add(dev)
        return None

    def _lt_gemm(
        self, plan: _Plan, dev: int, m: int, n: int, k: int, lda: int, ldb: int
    ) -> cublaslt.LtGemm | str:
        """The checked cuBLASLt call for one shape (``cublasLtMatmulAlgoCheck``)."""
        with self._lock:
            key = (dev, m, n, k, lda, ldb)
            gemm = plan.gemms.get(key)
            if gemm is not None:
                return gemm
            algo = bytes.fromhex(plan.lt["algo"])
            try:  # the caller made ``dev`` the current device
                gemm = cublaslt.LtGemm(
                    self._lt_handles[dev], algo, plan.dtype, plan.layout, m, n, k, lda, ldb, n
                )
            except Exception as exc:  # noqa: BLE001 - nvmath's cuBLASLt error: fall back
                self._warn_once(
                    f"cublaslt_algo:{plan.key}",
                    f"{self.package}: cuBLASLt refuses {plan.key}'s algorithm for "
                    f"{m}x{n}x{k} ({exc}); using torch for it",
                )
                return "cublaslt_algo"
            if len(plan.gemms) >= _READY_MAX:
                plan.gemms.clear()
            plan.gemms[key] = gemm
            return gemm

    def _lt_workspace(self, torch: Any, dev: int, stream: int) -> Any:
        """cuBLASLt's workspace for one stream of ``dev`` (one per stream: two streams
        running at once must not share one), as large as the table's largest need.
        Allocated through torch, so a call inside graph capture draws it from the
        graph's pool; it is kept for the life of the process."""
        with self._lock:
            ws = self._lt_workspaces.get((dev, stream))
            if ws is None:
                size = max(
                    (
                        int(e["cublaslt"]["workspace_bytes"])
                        for e in self.table.entries
                        if e.get("kind") == "cublaslt"
                    ),
                    default=0,
                )
                ws = torch.empty(max(size, 1), dtype=torch.uint8, device=f"cuda:{dev}")
                self._lt_workspaces[(dev, stream)] = ws
            return ws

    def _device_info(self, torch: Any, dev: int) -> _Device:
        """Check a device against the table once: arch, driver, GPU model."""
        with self._lock:
            info = self._devices.get(dev)
            if info is None:
                info = self._check_device(torch, dev)
                self._devices[dev] = info
            return info

    def _check_device(self, torch: Any, dev: int) -> _Device:
        table = self.table
        major, minor = torch.cuda.get_device_capability(dev)
        # sm_90a cubins run on compute capability 9.0 only: match the digits exactly.
        arch = next((x for x in table.archs if _arch_digits(x) == f"{major}{minor}"), None)
        if arch is None:
            return _Device(None, None, "arch")
        reason = self._check_driver()
        if reason is not None:
            return _Device(None, arch, reason)
        name = torch.cuda.get_device_name(dev)
        gpu, stand_in = table.resolve_gpu(name, arch)
        if gpu is None:
            return _Device(None, arch, "gpu")
        if stand_in:
            self._warn_once(
                f"stand-in:{name}",
                f"{self.package}: GPU model {name!r} is not in the dispatch table; using "
                f"the kernels measured on {gpu!r} (same arch {arch}) as stand-ins",
            )
        return _Device(gpu, arch, None)

    def _check_driver(self) -> str | None:
        """The driver must support the newest CUDA the table was measured under."""
        if self._driver_checked:
            return self._driver_reason
        needed = max((_version(v) for v in self.table.cuda_versions), default=(0, 0))
        reason = None
        try:
            have = driver.driver_version()
        except (ImportError, driver.CudaDriverError) as exc:
            have, reason = None, "driver"
            self._warn_once(
                "driver", f"{self.package}: cannot query the CUDA driver ({exc}); using torch"
            )
        if have is not None and have < needed:
            reason = "driver"
            self._warn_once(
                "driver",
                f"{self.package}: the driver supports CUDA {have[0]}.{have[1]} but the kernels "
                f"need {needed[0]}.{needed[1]}; using torch for every call",
            )
        self._driver_reason, self._driver_checked = reason, True
        return reason

    def _plan(self, entry: dict[str, Any]) -> _Plan:
        """The plan of one entry, with its kernel object (the cubin read from the
        package now, loaded into a context later by ``_load``)."""
        with self._lock:
            plan = self._plans.get(id(entry))
            if plan is not None:
                return plan
            plan = _Plan(entry)
            if plan.reason is None and plan.lt is None:
                try:
                    plan.kernel = self._kernel(entry)
                except OSError as exc:
                    plan.reason = "load_error"
                    self._warn_once(
                        f"load:{plan.key}",
                        f"{self.package}: cannot read the cubin of {plan.key} ({exc}); "
                        "using torch for it",
                    )
            self._plans[id(entry)] = plan
            return plan

    def _kernel(self, entry: dict[str, Any]) -> driver.Kernel:
        sha, symbol = entry["cubin_sha256"], entry["symbol"]
        kernel = self._kernels.get((sha, symbol))
        if kernel is None:
            path = importlib.resources.files(self.package).joinpath("cubins")
            cubin = path.joinpath(f"{sha}.cubin").read_bytes()
            smem = int(entry["launch"]["smem_bytes"])
            kernel = driver.Kernel(cubin, symbol, smem, expected_sha256=sha)
            self._kernels[(sha, symbol)] = kernel
        return kernel

    def _load(self, torch: Any, plan: _Plan, dev: int) -> str | None:
        """Load a plan's kernel on ``dev``; a fallback reason when it cannot be."""
        if torch.cuda.is_current_stream_capturing():
            # Loading a module during capture would break the capture.
            self._warn_once(
                "capture",
                f"{self.package}: a CUDA graph is being captured and {plan.key} is not "
                "loaded yet; using torch for it. Call warmup() before capturing.",
            )
            return "capture"
        with self._lock:
            if dev in plan.loaded:
                return None
            try:
                with torch.cuda.device(dev):
                    plan.kernel.function(dev)
            except (ImportError, driver.CudaDriverError) as exc:
                plan.reason = "load_error"
                self._warn_once(
                    f"load:{plan.key}",
                    f"{self.package}: cannot load {plan.key} ({exc}); using torch for it",
                )
                return "load_error"
            plan.loaded.add(dev)
        return None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=4)


def _arch_digits(arch: str) -> str:
    """``"sm_90a"`` -> ``"90"``: the compute capability an arch's cubins run on."""
    return arch.removeprefix("sm_").rstrip("abcdefghijklmnopqrstuvwxyz")


def _version(text: str) -> tuple[int, int]:
    """``"13.0"`` -> (13, 0); an unreadable version asks for nothing."""
    try:
        major, _, minor = str(text).partition(".")
        return int(major), int(minor.split(".")[0] or 0)
    except ValueError:
        return (0, 0)


def bind(package: str) -> Api:
    """The ``Api`` of the generated package ``package`` (its import name), which ships
    ``dispatch.json`` and ``cubins/<sha256>.cubin``. Reads nothing yet."""
    return Api(package)
