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
import threading
import warnings
from collections import Counter
from typing import Any

from . import arrays, cublaslt, driver, fused, rope_kv
from .abi import (
    ABIS,
    ROW_SCALED,
    EpilogueArgs,
    GemmArgs,
    Operands,
    disabled,
    linear_operands,
    matmul_operands,
    misaligned,
    native_off,
    out_columns,
)
from .table import (
    MAX_TABLE_BYTES,
    CublasLtAlgo,
    DispatchTable,
    EagerAlt,
    EntryKey,
    TableEntry,
    TableError,
)

_READY_MAX = 1 << 16  # shapes remembered as ready to launch (a few MB at most)
# A row-scaled call with no kernel of its own at its M (no entry there, or a fallback
# entry: the build measured torch's unfused math faster than every row-scaled kernel)
# takes torch's RMSNorm (``fused.rms_normed``, the unfused path's own first step, so the
# rounding is the unfused path's) and then its twins' entries: the gated kernel, or the
# plain GEMM (with the bias) as ``linear`` runs it. sm90tma's prefill kernels (the
# persistent TMA store) render the gated activation and the bias but never the row
# scale, so at prefill M this is how a patched layer's qkv and gate_up take them; and
# ``m_ranges`` of the row-scaled epilogue covers its twins' spans too.
NORMED_TWINS: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("none",),
    "rmsnorm_bias": ("bias", "none"),
    "rmsnorm_silu": ("silu",),
    "rmsnorm_gelu_tanh": ("gelu_tanh",),
}
_TWIN_REASONS = ("no_entry", "fallback_entry")  # a row-scaled call's: its twins may serve
_new_tuple = tuple.__new__

_torch: Any = None  # the torch module, once imported
_DTYPE_NAMES: dict[Any, str] = {}  # torch dtype -> table dtype
_PLAIN_TYPES: tuple[type, ...] = ()  # tensor types that are safe to hand to a kernel
_raw_stream: Any = None  # device index -> current cudaStream_t, the cheapest way available


def _import_torch(package: str = "cudal2_kernels_<name>") -> Any:
    """Import torch on first use and cache what the hot path needs from it. Without
    torch, the ImportError names the wheel's extra that installs it."""
    global _torch, _DTYPE_NAMES, _PLAIN_TYPES, _raw_stream
    if _torch is None:
        try:
            import torch
        except ImportError as exc:
            raise ImportError(
                f"{package} needs torch for torch tensors, which is not installed: "
                f"pip install '{package}[torch]' (or, for CuPy/DLPack arrays without "
                f"torch, '{package}[cupy]')"
            ) from exc

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

    ``hits[entry]`` counts kernel launches per table entry (named ``str(entry.key)``;
    an entry's eager alternative, launched when no CUDA graph is being captured, counts
    under ``str(entry.key) + "/eager"``);
    ``fallbacks[reason]`` counts calls served by torch, by the first reason found:
    ``disabled`` (CUDAL2_DISABLE=1), ``tensor_type`` (not a plain tensor; through the
    op, not a tensor at all), ``compiling``
    (torch.compile tracing), ``rank``, ``not_strided`` (sparse, nested), ``dtype`` (not fp16/bf16 or
    mixed), ``grad`` (autograd would need a backward; the torch op has one), ``bias``
    (not an [N] tensor of the input's dtype and device), ``shape`` (mismatch: torch
    raises), ``empty``, ``stride`` (inner stride, leading dim or view rules),
    ``alignment`` (pointer not 16-byte aligned; a residual read by TMA also with its row
    stride a multiple of 8 elements), ``device`` (not one CUDA device),
    ``residual`` (``linear_residual``'s residual or ``out`` cannot be taken),
    ``arch``, ``driver``, ``gpu``, ``no_entry``, ``fallback_entry`` (the table chose
    the baseline), ``align`` (the recipe's dims), ``fits`` (grid or int limits),
    ``abi`` (a launch ABI this runtime does not know), ``capture`` (kernel not loaded
    during graph capture), ``load_error``, ``launch_error``; for cuBLASLt entries
    ``cublaslt_missing`` (nvmath-python not importable), ``cublaslt_version`` (another
    cuBLASLt than the one the algorithm was measured with), ``cublaslt_algo``
    (cublasLtMatmulAlgoCheck refuses this shape or wants more workspace); ``table``
    (the package's ``dispatch.json`` cannot be read or breaks format 1).

    Updates are not locked: concurrent calls from several threads may miss a count.
    """

    def __init__(self) -> None:
        self._hits: Counter[str] = Counter()
        self._fallbacks: Counter[str] = Counter()
        # The native launcher's counters, moved into these on every read (``native``).
        self._drain: Any = None

    @property
    def hits(self) -> Counter[str]:
        """Kernel launches per table entry (both launch paths)."""
        if self._drain is not None:
            self._drain(self._hits, self._fallbacks)
        return self._hits

    @property
    def fallbacks(self) -> Counter[str]:
        """Calls served by torch, per reason (both launch paths)."""
        if self._drain is not None:
            self._drain(self._hits, self._fallbacks)
        return self._fallbacks

    def reset(self) -> None:
        """Zero every counter."""
        if self._drain is not None:
            self._drain(self._hits, self._fallbacks)
        self._hits.clear()
        self._fallbacks.clear()

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
    cuBLASLt algorithm (kind ``cublaslt``), and where it is loaded. ``eager``: the
    plan of the entry's eager alternative (``TableEntry.eager``), run in its place
    when the caller's stream is not capturing; that plan (``alt=True``) is named
    ``<entry>/eager`` in the stats."""

    __slots__ = (
        "align",
        "dtype",
        "eager",
        "gemms",
        "kernel",
        "layout",
        "loaded",
        "lt",
        "name",
        "reason",
        "recipe",
        "tma_r",
    )

    def __init__(self, entry: TableEntry, alt: bool = False):
        self.name = str(entry.key) + ("/eager" if alt else "")  # for stats and warnings
        self.dtype = entry.dtype
        self.layout = entry.layout
        kind = "kernel" if alt else entry.kind
        launch = entry.eager.launch if alt and entry.eager is not None else entry.launch
        # A plain dict: the launcher reads it on every call (a read-only view costs more).
        self.recipe: dict[str, Any] = dict(launch or {})
        # (index into (m, n, k), required multiple), checked on every call
        dims = {"m": 0, "n": 1, "k": 2}
        self.align = tuple(
            (dims[d], int(v)) for d, v in (self.recipe.get("align") or {}).items() if int(v) > 1
        )
        # the kernel reads the residual through a tensor map (R 16-byte aligned, ldr % 8 == 0)
        self.tma_r = "r" in (self.recipe.get("tma") or {})
        self.kernel: driver.Kernel | None = None
        self.loaded: set[int] = set()  # device indices where the kernel (or cuBLASLt) is ready
        self.lt: CublasLtAlgo | None = None if alt else entry.cublaslt
        self.eager: _Plan | None = None  # set by Api._plan where the entry has one
        # (device, m, n, k, lda, ldb) -> the cuBLASLt call checked for that shape
        self.gemms: dict[tuple, cublaslt.LtGemm] = {}
        self.reason: str | None = None if kind in ("kernel", "cublaslt") else "fallback_entry"
        if kind == "kernel" and self.recipe.get("abi", "gemm_v1") not in ABIS:
            self.reason = "abi"  # a kernel of a newer runtime's ABI


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


def _bias_reason(torch: Any, x: Any, n: int, bias: Any, in_op: bool) -> str | None:
    """A ``bias`` given to ``F.linear(x, w, bias)`` with w [n, K] (checked before: a
    0-dim w has no N): an [N] strided tensor of x's dtype and device (the kernel's output
    gets it added after) or None; else the reason ``bias``."""
    if (
        (not in_op and type(bias) not in _PLAIN_TYPES)
        or bias.layout is not torch.strided
        or bias.dtype is not x.dtype
        or bias.dim() != 1
        or bias.shape[0] != n
        or bias.device != x.device
        or (not in_op and bias.requires_grad and torch.is_grad_enabled())
    ):
        return "bias"
    return None


def _linear_operands(torch: Any, x: Any, w: Any, bias: Any, in_op: bool) -> Any:
    """``F.linear(x, w, bias)``'s operands (``linear_operands``: the GEMM's shape and
    strides) after the checks every call takes, and a bias checked against their N; or
    the reason to fall back (a string)."""
    try:
        got = _common_checks(torch, x, w, in_op) or linear_operands(
            x.shape, x.stride(), w.shape, w.stride()
        )
    except RuntimeError as exc:
        got = _nested_reason(x, w, exc)
    if bias is not None and type(got) is tuple:
        got = _bias_reason(torch, x, got[2], bias, in_op) or got
    return got


def _residual_ld(torch: Any, x: Any, n: int, residual: Any, in_op: bool) -> int | str:
    """The row stride (elements) of a residual for ``linear_residual``: a strided tensor
    of x's dtype and device, shaped as the output (x's leading dims, then N), with unit
    inner stride, and rows at one stride (2-D), or contiguous; else the reason
    ``residual``."""
    if (
        residual.layout is not torch.strided
        or residual.dtype is not x.dtype
        or residual.device != x.device
        or tuple(residual.shape) != (*x.shape[:-1], n)
        or (not in_op and residual.requires_grad and torch.is_grad_enabled())
    ):
        return "residual"
    if residual.dim() == 2 and residual.stride(1) == 1 and residual.stride(0) >= n:
        return residual.stride(0)
    if residual.is_contiguous():
        return n
    return "residual"


def _span(t: Any) -> tuple[int, int]:
    """The bytes [start, end) a strided tensor may touch."""
    start = t.data_ptr()
    extent = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return start, start + (extent + 1) * t.element_size() if t.numel() else start


def _out_reason(torch: Any, x: Any, w: Any, bias: Any, residual: Any, out: Any) -> str | None:
    """``out`` for ``linear_residual``: contiguous, the residual's shape, dtype and
    device, and either the residual itself (in place: each element is read, then
    written, by one thread) or touching none of its bytes, nor x's, w's or bias's (the
    kernel reads those while other CTAs write)."""
    if (
        type(out) not in _PLAIN_TYPES
        or out.layout is not torch.strided
        or out.dtype is not residual.dtype
        or out.device != residual.device
        or tuple(out.shape) != tuple(residual.shape)
        or not out.is_contiguous()
    ):
        return "residual"
    lo, hi = _span(out)
    same = out.data_ptr() == residual.data_ptr() and out.stride() == residual.stride()
    others = [x, w] + ([] if bias is None else [bias]) + ([] if same else [residual])
    for t in others:
        a, b = _span(t)
        if a < hi and lo < b:
            return "residual"
    return None


def _nested_reason(a: Any, b: Any, exc: RuntimeError) -> str:
    """The reason ``not_strided`` for a nested tensor (strided layout, but no one shape
    or stride: asking raises ``exc``); any other error is re-raised. Called from an
    ``except`` block, so a call with plain tensors pays nothing for it."""
    if getattr(a, "is_nested", False) or getattr(b, "is_nested", False):
        return "not_strided"
    raise exc


def _tensors(a: Any, b: Any, bias: Any = None) -> bool:
    """Whether ``a`` and ``b`` are tensors and ``bias`` one or None."""
    tensor = _torch.Tensor
    return isinstance(a, tensor) and isinstance(b, tensor) and isinstance(bias, tensor | None)


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

    def __init__(self, package: str, native_sha256: dict[str, str] | None = None):
        self.package = package
        self.stats = Stats()
        # The native launcher (``native``): the sha256 of its files recorded at build
        # time; once the ops are registered, the ``native.Native`` serving them, or None
        # with the reason in ``native_reason``.
        self.native_sha256 = dict(native_sha256 or {})
        self.native: Any = None
        self.native_reason: str | None = "the torch ops are not registered"
        self._native_linear: Any = None  # the op's overload, for linear() on CUDA tensors
        self._native_matmul: Any = None
        self._table: DispatchTable | None = None
        self._lock = threading.RLock()
        self._devices: dict[int, _Device] = {}
        self._plans: dict[EntryKey, _Plan] = {}  # entry identity -> plan
        self._kernels: dict[tuple[str, str], driver.Kernel] = {}
        # (device, dtype, layout, m, n, k) -> a plan that passed every check there (or
        # a fallback entry's plan whose eager alternative did)
        self._ready: dict[tuple, _Plan] = {}
        # the same shapes -> the entry's eager alternative, where it passed them too
        self._eager: dict[tuple, _Plan] = {}
        self._warned: set[str] = set()
        self._lt_handles: dict[int, int] = {}  # device -> cuBLASLt handle
        self._lt_workspaces: dict[tuple[int, int], Any] = {}  # (device, stream) -> workspace
        self._driver_reason: str | None = None
        self._driver_checked = False
        self._covered: set[tuple[str, str, int, int]] | None = None
        # (dtype, n, k, epilogue) of the table's fused-epilogue entries (None: not read)
        self._epilogues: set[tuple[str, int, int, str]] | None = None
        self._table_reason: str | None = None  # "table": dispatch.json cannot be trusted

    def __repr__(self) -> str:
        return f"Api({self.package!r})"

    @property
    def launcher(self) -> str:
        """Which path launches a torch CUDA call now: ``"native"`` (the compiled
        launcher registered as the ops' CUDA kernel) or ``"python"`` (it is absent or
        cannot serve: ``native_reason``; or ``CUDAL2_NATIVE=0``)."""
        return "native" if self.native is not None and not native_off() else "python"

    @property
    def table(self) -> DispatchTable:
        """The package's dispatch table (``dispatch.json``, read and checked on first
        access). A table that cannot be read or breaks format 1 is not trusted: one
        warning, then an empty table, so every call falls back (reason ``table``)."""
        table = self._table
        if table is None:
            with self._lock:
                if self._table is None:
                    self._table = self._read_table()
                table = self._table
        return table

    def _read_table(self) -> DispatchTable:
        source = f"{self.package}/dispatch.json"
        try:
            path = importlib.resources.files(self.package).joinpath("dispatch.json")
            with path.open("rb") as f:  # bounded: a file past the limit is refused whole
                data = f.read(MAX_TABLE_BYTES + 1)
            return DispatchTable.from_bytes(data, source)
        except (OSError, TableError) as exc:
            self._table_reason = "table"
            self._warn_once(
                "table",
                f"{self.package}: cannot use its dispatch table ({exc}); using torch for "
                "every call",
            )
            return DispatchTable(  # no entries: every call falls back
                package=self.package,
                name=self.package,
                version="0",
                tool_version="",
                manifest_sha256="",
                gpu_models=(),
                archs=(),
                drivers=(),
                cuda_versions=(),
                measured_from=None,
                measured_to=None,
                entries=(),
            )

    def matmul(self, a: Any, b: Any) -> Any:
        """``torch.matmul(a, b)``; 2-D a [M, K] with b row-major [K, N] (layout nn) or
        b the transpose view of a row-major [N, K] (layout tn) may run a kernel.
        CuPy and other DLPack / CUDA-array-interface arrays go through ``arrays``
        (no torch needed; a CuPy array back)."""
        if (_torch is None or type(a) not in _PLAIN_TYPES) and arrays.is_foreign(a):
            return arrays.run(self, "matmul", a, b)
        if self.native is not None and self._native_call(a, b, None):
            with _torch._C._AutoDispatchBelowAutograd():
                return self._native_matmul(a, b)
        return self._matmul(a, b, False)

    def linear(self, x: Any, w: Any, bias: Any = None) -> Any:
        """``torch.nn.functional.linear(x, w, bias)``: x [..., K], w [N, K] -> [..., N],
        as layout tn with M = the product of x's leading dims; a bias [N] goes into the
        table's ``bias`` entry for the call where it has one (A W^T + bias in fp32,
        rounded once), else is added to the kernel's output after it. Both the Python
        path and the native op's kernel try the ``bias`` entry first. Other arrays: as
        ``matmul``."""
        if (_torch is None or type(x) not in _PLAIN_TYPES) and arrays.is_foreign(x):
            return arrays.run(self, "linear", x, w, bias)
        if self.native is not None and self._native_call(x, w, bias):
            with _torch._C._AutoDispatchBelowAutograd():  # nothing to record (see ops)
                return self._native_linear(x, w, bias)
        return self._linear(x, w, bias, False)

    def _native_call(self, x: Any, w: Any, bias: Any) -> bool:
        """Whether ``linear``/``matmul`` hands these inputs to the op (native kernel):
        plain CUDA tensors that autograd does not record, outside tracing, native path
        on; the op's kernel then applies every other rule of the Python path."""
        if type(x) not in _PLAIN_TYPES or type(w) not in _PLAIN_TYPES:
            return False  # torch's own answer (or exception) through the Python path
        if not x.is_cuda or native_off():
            return False
        if bias is not None and type(bias) not in _PLAIN_TYPES:
            return False  # the Python path's "bias" rule decides
        if (
            x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad)
        ) and _torch.is_grad_enabled():
            return False  # "grad" / "bias": F.linear records the graph
        if _torch.compiler.is_compiling():
            return False
        if self._native_linear is None:
            ops = getattr(_torch.ops, self.native.namespace)
            self._native_linear, self._native_matmul = ops.linear.default, ops.matmul.default
        return True

    def op_matmul(self, a: Any, b: Any) -> Any:
        """``matmul`` as the torch op's kernel (``_common_checks``' ``in_op``)."""
        try:
            return self._matmul(a, b, True)
        except AttributeError:
            if _tensors(a, b):
                raise
            self.stats._fallbacks["tensor_type"] += 1
            return _torch.ops.aten.matmul(a, b)  # raises as torch's own op does

    def op_linear(self, x: Any, w: Any, bias: Any = None) -> Any:
        """``linear`` as the torch op's kernel (``_common_checks``' ``in_op``)."""
        try:
            return self._linear(x, w, bias, True)
        except AttributeError:
            # The dispatcher hands None given for a Tensor argument to the kernel (an
            # undefined tensor): torch's own op refuses it, and so does this one. Caught
            # here rather than checked, so the call with tensors pays nothing for it.
            if _tensors(x, w, bias):
                raise
            self.stats._fallbacks["tensor_type"] += 1
            return _torch.ops.aten.linear(x, w, bias)

    def _matmul(self, a: Any, b: Any, in_op: bool) -> Any:
        torch = _torch or _import_torch(self.package)
        try:
            got = _common_checks(torch, a, b, in_op) or matmul_operands(
                a.shape, a.stride(), b.shape, b.stride()
            )
        except RuntimeError as exc:
            got = _nested_reason(a, b, exc)
        if type(got) is tuple:
            got = self._run(torch, a, b, got)
            if type(got) is not str:
                return got
        self.stats._fallbacks[got] += 1
        return torch.matmul(a, b)

    def _linear(self, x: Any, w: Any, bias: Any, in_op: bool) -> Any:
        torch = _torch or _import_torch(self.package)
        got = _linear_operands(torch, x, w, bias, in_op)
        if bias is not None and type(got) is tuple and self._fuses(x.dtype, w, "bias"):
            # A fused-bias entry where the table has one for this M; else today's path
            fused = self._run(torch, x, w, got, "bias", (bias, None))
            if type(fused) is not str:
                return fused if x.dim() == 2 else fused.view(*x.shape[:-1], got[2])
        if type(got) is tuple:
            n = got[2]
            got = self._run(torch, x, w, got)
            if type(got) is not str:
                if bias is not None:
                    got.add_(bias)
                return got if x.dim() == 2 else got.view(*x.shape[:-1], n)
        self.stats._fallbacks[got] += 1
        return torch.nn.functional.linear(x, w, bias)

    def linear_residual(
        self, x: Any, w: Any, residual: Any, bias: Any = None, out: Any = None
    ) -> Any:
        """``F.linear(x, w, bias) + residual`` (x [..., K], w [N, K], residual [..., N]
        of the output's shape): one kernel of a fused epilogue (``residual`` or
        ``bias_residual``: A W^T + bias + R summed in fp32, rounded once) where the table
        has one for the shape; else torch's own ops, bit for bit what
        ``F.linear(x, w, bias) + residual`` gives. ``out`` (optional): where the result
        goes (it may be ``residual`` itself: in place; not x, w or bias)."""
        if out is None and self.native is not None:
            op = self._native_fused("linear_residual", x, w, residual, bias)
            if op is not None:
                return self._call_native(op, x, w, residual, bias)
        got = self._linear_residual(x, w, residual, bias, out, False)
        if type(got) is str:
            self.stats._fallbacks[got] += 1
            torch = _torch
            y = torch.nn.functional.linear(x, w, bias)
            return torch.add(y, residual) if out is None else torch.add(y, residual, out=out)
        return got

    def op_linear_residual(self, x: Any, w: Any, residual: Any, bias: Any = None) -> Any:
        """``linear_residual`` as the torch op's kernel (no ``out``: the op is functional)."""
        got = self._linear_residual(x, w, residual, bias, None, True)
        if type(got) is str:
            self.stats._fallbacks[got] += 1
            return _torch.nn.functional.linear(x, w, bias) + residual
        return got

    def _linear_residual(
        self, x: Any, w: Any, residual: Any, bias: Any, out: Any, in_op: bool
    ) -> Any:
        """The fused result, or the reason to fall back (``residual``: the residual or
        ``out`` cannot be taken; ``no_entry``...: as ``linear``)."""
        torch = _torch or _import_torch(self.package)
        if not in_op and type(residual) not in _PLAIN_TYPES:
            return "tensor_type"
        got = _linear_operands(torch, x, w, bias, in_op)
        if type(got) is not tuple:
            return got
        n = got[2]
        ldr = _residual_ld(torch, x, n, residual, in_op)
        if type(ldr) is str:
            return ldr
        if out is not None and _out_reason(torch, x, w, bias, residual, out) is not None:
            return "residual"
        epilogue = "residual" if bias is None else "bias_residual"
        if not self._fuses(x.dtype, w, epilogue):
            return "no_entry"
        c = self._run(torch, x, w, got, epilogue, (bias, residual), ldr, out)
        if type(c) is str:
            return c
        return c if x.dim() == 2 or out is not None else c.view(*x.shape[:-1], n)

    def linear_gated(self, x: Any, w: Any, act: str, eps: float | None = None) -> Any:
        """``act(g) * u`` over the (gate, up) pairs of ``F.linear(x, w)``: x [..., K], w
        a packed gate_up weight [2I, K] (``pack_gate_up``) -> [..., I]; ``act``
        ``"silu"`` or ``"gelu_tanh"``. With ``eps``, x is the un-normalised h and w a
        weight with the norm's folded in (``fold_rmsnorm``): RMSNorm(h) first. One kernel
        of epilogue ``act`` / ``rmsnorm_<act>`` where the table has one for (dtype, N, K),
        else torch's unfused ops (``fused.unfused_gated``), exactly. Inputs torch could
        not compute either raise (TypeError / ValueError naming the tensor)."""
        if self.native is not None and (eps is None or type(eps) is float) and type(act) is str:
            op = self._native_fused("linear_gated", x, w)
            if op is not None:
                return self._call_native(op, x, w, act, eps)
        got = self._linear_gated(x, w, act, eps, False)
        if type(got) is str:
            self.stats._fallbacks[got] += 1
            return fused.unfused_gated(x, w, act, None if eps is None else float(eps))
        return got

    def op_linear_gated(self, x: Any, w: Any, act: str, eps: float | None = None) -> Any:
        """``linear_gated`` as the torch op's kernel."""
        got = self._linear_gated(x, w, act, eps, True)
        if type(got) is str:
            self.stats._fallbacks[got] += 1
            return fused.unfused_gated(x, w, act, None if eps is None else float(eps))
        return got

    def linear_rmsnorm(self, x: Any, w: Any, eps: float, bias: Any = None) -> Any:
        """``F.linear(RMSNorm(x), w, bias)``: x [..., K] the un-normalised h, w [N, K]
        with the norm's weight folded in (``fold_rmsnorm``) -> [..., N]. One kernel of
        epilogue ``rmsnorm`` / ``rmsnorm_bias`` (the per-row rsqrt(mean(h^2) + eps) as a
        row scale) where the table has one, else torch's unfused ops
        (``fused.unfused_rmsnorm``), exactly. Errors as ``linear_gated``."""
        if self.native is not None and type(eps) is float:
            op = self._native_fused("linear_rmsnorm", x, w, bias)
            if op is not None:
                return self._call_native(op, x, w, eps, bias)
        got = self._linear_rmsnorm(x, w, eps, bias, False)
        if type(got) is str:
            self.stats._fallbacks[got] += 1
            return fused.unfused_rmsnorm(x, w, float(eps), bias)
        return got

    def linear_rope_kv(
        self,
        x: Any,
        w: Any,
        eps: float,
        bias: Any,
        cos: Any,
        sin: Any,
        k_cache: Any,
        v_cache: Any,
        positions: Any,
        heads: Any,
    ) -> Any:
        """The attention front of a decoder layer in one kernel: ``F.linear(RMSNorm(x), w,
        bias)`` on the packed qkv weight (``fold_rmsnorm``, then ``rope_kv.pack_rope_rows``),
        RoPE on q and k (cos, sin [..., head_dim] as transformers passes them), k and v
        written into ``k_cache`` / ``v_cache`` [B, kv_heads, L, head_dim] at slots
        ``positions`` (int64 [seq]); returns q [..., q_heads * head_dim]. One kernel of
        epilogue ``rmsnorm_rope_kv`` / ``rmsnorm_bias_rope_kv`` where the table has one,
        else ``rope_kv.fallback`` (torch's GEMM, then the reference in fp32). Inputs it
        cannot compute raise (TypeError / ValueError naming the operand)."""
        args = (x, w, eps, bias, cos, sin, k_cache, v_cache, positions, heads)
        got = self._linear_rope_kv(*args, False)
        if type(got) is str:
            self.stats._fallbacks[got] += 1
            return rope_kv.fallback(x, w, float(eps), bias, cos, sin, k_cache, v_cache,
                                    positions, tuple(heads))  # fmt: skip
        return got

    def op_linear_rope_kv(self, *args: Any) -> Any:
        """``linear_rope_kv`` as the torch op's kernel."""
        got = self._linear_rope_kv(*args, True)
        if type(got) is str:
            self.stats._fallbacks[got] += 1
            x, w, eps, bias, cos, sin, k_cache, v_cache, positions, heads = args
            return rope_kv.fallback(x, w, float(eps), bias, cos, sin, k_cache, v_cache,
                                    positions, tuple(heads))  # fmt: skip
        return got

    def _linear_rope_kv(
        self, x, w, eps, bias, cos, sin, k_cache, v_cache, positions, heads, in_op: bool
    ) -> Any:
        """The fused result, or the reason to fall back (errors raise first)."""
        torch = _torch or _import_torch(self.package)
        op = "linear_rope_kv"
        value = fused.check_eps(op, eps)
        fused.check_inputs(op, x, w, bias)
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        split = rope_kv.check_operands(
            op, m, w.shape[0], x.dtype, x.device, heads, cos, sin, k_cache, v_cache, positions
        )
        if not in_op and (type(x) not in _PLAIN_TYPES or type(w) not in _PLAIN_TYPES):
            return "tensor_type"
        got = _linear_operands(torch, x, w, bias, in_op)
        if type(got) is not tuple:
            return got
        epilogue = "rmsnorm_rope_kv" if bias is None else "rmsnorm_bias_rope_kv"
        out_n = split[0] * split[2]
        if out_n % 8:
            return "stride"
        if not self._fuses(x.dtype, w, epilogue):
            return "no_entry"
        rope = rope_kv.kernel_args(split, cos, sin, k_cache, v_cache, positions)
        c = self._run(torch, x, w, got, epilogue, (bias, None), 0, None, value, rope)
        if type(c) is str:
            return c
        return c if x.dim() == 2 else c.view(*x.shape[:-1], out_n)

    def _native_fused(self, name: str, x: Any, w: Any, *more: Any) -> Any:
        """The fused op ``name``'s overload, where a call with these tensors goes to
        its native CUDA kernel (as ``_native_call``: plain CUDA tensors autograd does not
        record, outside tracing, native path on; the kernel applies every other rule, and
        hands what it does not launch to the op's Python kernel); else None."""
        if type(x) not in _PLAIN_TYPES or type(w) not in _PLAIN_TYPES:
            return None
        if not x.is_cuda or native_off():
            return None
        grad = x.requires_grad or w.requires_grad
        for t in more:
            if t is not None:
                if type(t) not in _PLAIN_TYPES:
                    return None  # the Python path's "tensor_type" / "bias" rules
                grad = grad or t.requires_grad
        if (grad and _torch.is_grad_enabled()) or _torch.compiler.is_compiling():
            return None
        return getattr(getattr(_torch.ops, self.native.namespace), name).default

    def _call_native(self, op: Any, *args: Any) -> Any:
        """``op(*args)`` below autograd (nothing to record, see ``_native_fused``); an
        error the op's Python kernel raised (TypeError / ValueError) reaches the caller
        as itself, not as the dispatcher's RuntimeError."""
        fused.forget_raised()
        try:
            with _torch._C._AutoDispatchBelowAutograd():
                return op(*args)
        except RuntimeError:
            raised = fused.raised_by_python()  # torch < 2.13 leaves its message in the log
            if raised is None:
                raise
            raise raised from None

    def op_linear_rmsnorm(self, x: Any, w: Any, eps: float, bias: Any = None) -> Any:
        """``linear_rmsnorm`` as the torch op's kernel."""
        got = self._linear_rmsnorm(x, w, eps, bias, True)
        if type(got) is str:
            self.stats._fallbacks[got] += 1
            return fused.unfused_rmsnorm(x, w, float(eps), bias)
        return got

    def _linear_gated(self, x: Any, w: Any, act: str, eps: Any, in_op: bool) -> Any:
        """The fused result, or the reason to fall back (errors raise first)."""
        torch = _torch or _import_torch(self.package)
        fused.check_act("linear_gated", act)
        value = 0.0 if eps is None else fused.check_eps("linear_gated", eps)
        fused.check_inputs("linear_gated", x, w, None, gated=True)
        epilogue = act if eps is None else f"rmsnorm_{act}"
        got = self._fused_call(torch, x, w, None, epilogue, value, in_op)
        if (
            type(got) is str
            and got in _TWIN_REASONS
            and eps is not None
            and self._fuses(x.dtype, w, act)
        ):
            # NORMED_TWINS: torch's RMSNorm, then the gated kernel (its rounding is the
            # unfused path's: x normalised to its dtype, then the GEMM)
            got = self._fused_call(torch, fused.rms_normed(x, value), w, None, act, 0.0, in_op)
        return got

    def _linear_rmsnorm(self, x: Any, w: Any, eps: Any, bias: Any, in_op: bool) -> Any:
        """The fused result, or the reason to fall back (errors raise first)."""
        torch = _torch or _import_torch(self.package)
        value = fused.check_eps("linear_rmsnorm", eps)
        fused.check_inputs("linear_rmsnorm", x, w, bias)
        epilogue = "rmsnorm" if bias is None else "rmsnorm_bias"
        got = self._fused_call(torch, x, w, bias, epilogue, value, in_op)
        if (
            type(got) is str
            and got in _TWIN_REASONS
            and w.dim() == 2
            and self.covers(w.shape[0], w.shape[1], dtype_name(x.dtype))
        ):
            # NORMED_TWINS: torch's RMSNorm, then ``linear``'s path (a bias entry, or
            # the plain one and the bias added; else F.linear: the unfused path's exact
            # ops), which counts its own hit or fallback
            return self._linear(fused.rms_normed(x, value), w, bias, in_op)
        return got

    def _fused_call(
        self, torch: Any, x: Any, w: Any, bias: Any, epilogue: str, eps: float, in_op: bool
    ) -> Any:
        """Launch the table's kernel of ``epilogue`` (gated or ROW_SCALED) for x, w (and
        bias): the output [..., out_columns(epilogue, N)], or a fallback reason: as
        ``linear``'s, and ``stride`` where the output's row (N / 2 when gated) is not a
        multiple of 8 elements (the ABI's ``ldc`` rule)."""
        if not in_op and (type(x) not in _PLAIN_TYPES or type(w) not in _PLAIN_TYPES):
            return "tensor_type"
        got = _linear_operands(torch, x, w, bias, in_op)
        if type(got) is not tuple:
            return got
        n = got[2]
        out_n = out_columns(epilogue, n)
        if out_n % 8:
            return "stride"
        if not self._fuses(x.dtype, w, epilogue):
            return "no_entry"
        c = self._run(torch, x, w, got, epilogue, (bias, None), 0, None, eps)
        if type(c) is str:
            return c
        return c if x.dim() == 2 else c.view(*x.shape[:-1], out_n)

    def _fuses(self, dtype: Any, w: Any, epilogue: str) -> bool:
        """Whether the table has an entry of ``epilogue`` for w's (N, K) and this dtype
        (on any GPU model; the lookup then decides for the call's M and device). A
        table without epilogue entries answers from an empty set."""
        got = self._epilogues
        if got is None:
            got = self._epilogues = {
                (e.dtype, e.n, e.k, e.epilogue)
                for e in self.table.entries
                if e.epilogue != "none" and e.kind == "kernel"
            }
        if not got or w.dim() != 2:
            return False
        return (dtype_name(dtype), w.shape[0], w.shape[1], epilogue) in got

    def covers(self, n: int, k: int, dtype: str, layout: str = "tn") -> bool:
        """Whether the table has a kernel or cuBLASLt entry, or an eager alternative,
        for (dtype, layout, N, K) on any of its GPU models (the op still checks the GPU
        at each call)."""
        covered = self._covered
        if covered is None:
            covered = {
                (e.dtype, e.layout, e.n, e.k)
                for e in self.table.entries
                if (e.kind in ("kernel", "cublaslt") or e.eager is not None)
                and e.epilogue == "none"
            }
            self._covered = covered
        return (dtype, layout, n, k) in covered

    def m_ranges(
        self,
        n: int,
        k: int,
        dtype: str,
        epilogue: str = "none",
        device: int | None = None,
        layout: str = "tn",
        decided: bool = False,
    ) -> tuple[tuple[int, int], ...]:
        """The M ranges (first, last; ascending, merged) at which a call of (dtype,
        layout, M, N, K) with fused ``epilogue`` finds a table entry that launches a
        kernel: a ``kernel`` or ``cublaslt`` entry, or (plain GEMMs) a fallback entry's
        eager alternative; for a row-scaled epilogue, also where a twin does after
        torch's RMSNorm (``NORMED_TWINS``): the gated kernel, or any entry of the plain
        GEMM (``linear``'s measured choice there). ``decided``: at which it finds any
        entry, a fallback entry too (the build measured torch's own ops fastest there).
        ``device``: a CUDA device index, answered for its GPU as its calls resolve it
        (nothing where the device cannot use the table); None: for any GPU model of the
        table (what a CPU run asks: the path a GPU would take). Loads and launches
        nothing; a call in range can still fall back at launch (alignment, the recipe's
        fit, a failed load: ``stats`` counts those)."""
        if device is None:
            models = self.table.models()
        else:
            torch = _torch or _import_torch(self.package)
            info = self._devices.get(device) or self._device_info(torch, device)
            if info.reason is not None:
                return ()
            models = [(info.gpu, info.arch)]
        spans = []
        served = (epilogue, *NORMED_TWINS.get(epilogue, ()))
        for gpu, arch in models:
            for name in served:
                for lo, hi, e in self.table.m_spans(gpu, arch, dtype, layout, n, k, name):
                    launches = e.kind in ("kernel", "cublaslt")
                    eager = name == "none" and e.eager is not None
                    # a row-scaled call's plain twin serves at any of its entries:
                    # ``linear``'s path there is the build's measured choice for that
                    # GEMM (a fallback entry's: F.linear, the unfused path's own)
                    plain_twin = name == "none" != epilogue
                    if name != epilogue and not (launches or eager or plain_twin):
                        continue  # a gated twin's fallback entry serves no row-scaled call
                    if decided or launches or eager or plain_twin:
                        spans.append((lo, hi))
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(spans):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
            else:
                merged.append((lo, hi))
        return tuple(merged)

    def covers_at(
        self,
        m: int,
        n: int,
        k: int,
        dtype: str,
        epilogue: str = "none",
        device: int | None = None,
    ) -> bool:
        """Whether a call at this M launches a table entry (``m_ranges``, layout tn)."""
        return any(lo <= m <= hi for lo, hi in self.m_ranges(n, k, dtype, epilogue, device))

    def warmup(self, device: int | None = None) -> int:
        """Load every kernel of the table for ``device`` (default: the current one),
        and ready its cuBLASLt entries (library, handle, the current stream's
        workspace), so that a CUDA-graph capture later loads nothing. Returns how many
        table entries are ready there; 0 when the device cannot use the table, or when
        there is no CUDA at all, or no torch (so calling it at start-up is safe; without
        torch, CuPy calls load their kernels on first use)."""
        if _torch is None:
            try:
                _import_torch(self.package)
            except ImportError:
                return 0
        torch = _torch
        if not torch.cuda.is_available():
            return 0
        dev = torch.cuda.current_device() if device is None else int(device)
        info = self._devices.get(dev) or self._device_info(torch, dev)
        if info.reason is not None:
            return 0
        loaded = 0
        for entry in self.table.entries_for(info.gpu, info.arch):
            plan = self._plans.get(entry.key) or self._plan(entry)
            alt = plan.eager
            if alt is not None and alt.reason is None and dev not in alt.loaded:
                self._load(torch, alt, dev)  # counted with its entry; a failure warns
            load = self._load if plan.lt is None else self._load_cublaslt
            if plan.reason is None and (dev in plan.loaded or load(torch, plan, dev) is None):
                loaded += 1
                if plan.lt is not None:  # the current stream's workspace too
                    self._lt_workspace(torch, dev, _raw_stream(dev))
                elif plan.recipe.get("workspace_per_cta"):  # ... a stream-K kernel's
                    grid = driver.persistent_slots(plan.recipe, driver.sm_count(dev))
                    nbytes = driver.workspace_bytes(plan.recipe, grid)
                    driver.stream_workspace(dev, _raw_stream(dev), nbytes)
        return loaded

    # -- the dispatch path -------------------------------------------------------

    def _run(
        self,
        torch: Any,
        a: Any,
        b: Any,
        operands: Operands,
        epilogue: str = "none",
        epi: tuple = (None, None),
        ldr: int = 0,
        out: Any = None,
        eps: float = 0.0,
        rope: Any = None,
    ) -> Any:
        """Launch the table's kernel for ``a`` and ``b`` (their ``operands``); the
        [M, N] output (``out`` where given; [M, N / 2] after a gated epilogue), or a
        reason. ``epilogue``: the fused op's entry, its operands ``epi`` = (bias,
        residual) (checked by the caller; the residual's row stride ``ldr``; ``eps``
        for a ROW_SCALED one)."""
        a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
        if misaligned(a_ptr, b_ptr):
            return "alignment"
        if not (a.is_cuda and b.is_cuda):
            return "device"
        dev = a.get_device()
        if b.get_device() != dev:
            return "device"
        layout, m, n, k, lda, ldb = operands
        ops = None
        ldc = 0  # N
        shape = (dev, _DTYPE_NAMES[a.dtype], layout, m, n, k)
        if epilogue != "none":
            bias, residual = epi
            if bias is not None and bias.stride(0) != 1 and n != 1:
                return "bias"  # the kernel reads bias[n]: a strided one is torch's to add
            ops = EpilogueArgs(
                0 if bias is None else bias.data_ptr(),
                0 if residual is None else residual.data_ptr(),
                ldr,
                eps if epilogue in ROW_SCALED else 0.0,
                rope,
            )
            shape = (*shape, epilogue)
            heads = () if rope is None else (rope.q_heads, rope.kv_heads, rope.head_dim)
            ldc = out_columns(epilogue, n, heads)
        if out is not None:
            return self._dispatch(
                torch, shape, a_ptr, b_ptr, lda, ldb, lambda: out, _raw_stream, ops, ldc
            )
        return self._dispatch(
            torch,
            shape,
            a_ptr,
            b_ptr,
            lda,
            ldb,
            lambda: torch.empty((m, ldc or n), dtype=a.dtype, device=a.device),
            _raw_stream,
            ops,
            ldc,
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
        epilogue: EpilogueArgs | None = None,
        ldc: int = 0,
    ) -> Any:
        """Run the plan for ``shape`` = (device, dtype, layout, m, n, k), with a fused
        epilogue's name appended for its entry, on operands at ``a_ptr`` / ``b_ptr``
        (and the epilogue's, ``epilogue``): the output ``alloc()`` made, or a fallback
        reason. ``be`` is torch, or the CuPy stand-in of ``arrays``;
        ``stream_of(device)`` the caller's current stream there. ``ldc``: the output's
        row stride where it is not N (a gated epilogue's N / 2)."""
        plan = self._ready.get(shape)
        if plan is None:
            plan = self._prepare(be, shape)
            if type(plan) is str:
                return plan
        if plan.eager is not None and not be.cuda.is_current_stream_capturing():
            # Eager: the alternative's launch costs less host time than the entry's
            # call; under capture only GPU time counts, and the entry's choice runs.
            alt = self._eager.get(shape)
            if alt is not None and alt.reason is None:
                plan = alt
        if plan.reason is not None:  # a fallback entry, or a launch that failed
            return plan.reason
        if plan.tma_r and (epilogue.residual % 16 or epilogue.ldr % 8):
            return "alignment"  # R's tensor map (the table gives such a plan a residual)
        dev, _, _, m, n, k = shape[:6]
        c = alloc()
        # GemmArgs(...) runs a Python-level __new__; tuple's own is the same record at
        # half the cost, and this line runs on every call.
        gemm = _new_tuple(GemmArgs, (a_ptr, b_ptr, c.data_ptr(), m, n, k, lda, ldb, ldc or n))
        try:
            if be.cuda.current_device() == dev:
                reason = self._launch(be, plan, dev, gemm, stream_of, epilogue)
            else:
                # The driver launches in the current context: make it the device's.
                with be.cuda.device(dev):
                    reason = self._launch(be, plan, dev, gemm, stream_of, epilogue)
        except (driver.CudaDriverError, cublaslt.LtError) as exc:
            plan.reason = "launch_error"
            self._warn_once(
                f"launch:{plan.name}",
                f"{self.package}: launching {plan.name} failed ({exc}); using the fallback for it",
            )
            return "launch_error"
        if reason is not None:
            return reason
        self.stats._hits[plan.name] += 1
        return c

    def _prepare(self, torch: Any, shape: tuple) -> _Plan | str:
        """The plan for (device, dtype, layout, m, n, k) (and a fused epilogue's name,
        appended: its own entries), loaded on the device and remembered so the next
        call of this shape skips every check below; or a fallback reason."""
        dev, dtype, layout, m, n, k = shape[:6]
        epilogue = shape[6] if len(shape) > 6 else "none"
        info = self._devices.get(dev) or self._device_info(torch, dev)
        if info.reason is not None:
            return info.reason
        entry = self.table.lookup_exact(info.gpu, info.arch, dtype, layout, m, n, k, epilogue)
        if entry is None:
            return "no_entry"
        plan = self._plans.get(entry.key) or self._plan(entry)
        alt, remember = plan.eager, True
        if alt is not None:
            why = alt.reason or self._ready_on(torch, alt, dev, m, n, k)
            if why == "capture" and plan.reason is None:
                alt, remember = None, False  # loaded by the next call outside capture
            elif why == "capture":
                return why
            elif why is not None:
                alt = None  # the alternative cannot take this shape: the entry's choice
        if plan.reason is not None and alt is None:
            return plan.reason
        if plan.reason is None:
            reason = self._ready_on(torch, plan, dev, m, n, k)
            if reason is not None:
                return reason
        if remember:
            if len(self._ready) >= _READY_MAX:
                self._ready.clear()  # many distinct M values: start over rather than grow
                self._eager.clear()
            self._ready[shape] = plan
            if alt is not None:
                self._eager[shape] = alt
        return plan

    def _ready_on(self, torch: Any, plan: _Plan, dev: int, m: int, n: int, k: int) -> str | None:
        """Whether ``plan`` can run (m, n, k) on ``dev``, loading it there first: None,
        or the fallback reason."""
        mnk = (m, n, k)
        for dim, multiple in plan.align:
            if mnk[dim] % multiple:
                return "align"
        if plan.lt is None and not driver.gemm_fits(plan.recipe, m, n, k):
            return "fits"
        if dev not in plan.loaded:
            load = self._load if plan.lt is None else self._load_cublaslt
            return load(torch, plan, dev)
        return None

    def _launch(
        self,
        be: Any,
        plan: _Plan,
        dev: int,
        gemm: GemmArgs,
        stream_of: Any,
        epilogue: EpilogueArgs | None = None,
    ) -> str | None:
        """Queue the plan's kernel (or cuBLASLt algorithm) on the caller's current
        stream, never synchronising: ordering is the stream's. A fallback reason when
        cuBLASLt refuses this shape (checked once per shape and leading dims)."""
        stream = stream_of(dev)
        if plan.lt is None:
            driver.launch_gemm(plan.kernel, plan.recipe, gemm, stream, dev, epilogue)
            return None
        lt = plan.gemms.get((dev, *gemm[3:8]))
        if lt is None:
            lt = self._lt_gemm(plan, dev, gemm)
            if type(lt) is str:
                return lt
        ws = self._lt_workspaces.get((dev, stream))
        if ws is None:
            ws = self._lt_workspace(be, dev, stream)
        if lt.workspace_bytes > ws.numel():
            return "cublaslt_algo"
        lt.run(gemm, ws.data_ptr(), ws.numel(), stream)
        return None

    # -- first-use work (under the lock, off the hot path) -----------------------

    def _load_cublaslt(self, torch: Any, plan: _Plan, dev: int) -> str | None:
        """Ready a cuBLASLt entry on ``dev``: the bindings import, the library is the
        version the algorithm was measured with, a handle exists for the device."""
        if torch.cuda.is_current_stream_capturing():
            self._warn_once(
                "capture",
                f"{self.package}: a CUDA graph is being captured and {plan.name} is not "
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
            want = plan.lt.version
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

    def _lt_gemm(self, plan: _Plan, dev: int, gemm: GemmArgs) -> cublaslt.LtGemm | str:
        """The checked cuBLASLt call for ``gemm``'s shape (``cublasLtMatmulAlgoCheck``)."""
        with self._lock:
            key = (dev, *gemm[3:8])  # (device, m, n, k, lda, ldb); ldc is n
            lt = plan.gemms.get(key)
            if lt is not None:
                return lt
            algo = bytes.fromhex(plan.lt.algo)
            try:  # the caller made ``dev`` the current device
                lt = cublaslt.LtGemm(self._lt_handles[dev], algo, plan.dtype, plan.layout, gemm)
            except Exception as exc:  # noqa: BLE001 - nvmath's cuBLASLt error: fall back
                self._warn_once(
                    f"cublaslt_algo:{plan.name}",
                    f"{self.package}: cuBLASLt refuses {plan.name}'s algorithm for "
                    f"{gemm.m}x{gemm.n}x{gemm.k} ({exc}); using torch for it",
                )
                return "cublaslt_algo"
            if len(plan.gemms) >= _READY_MAX:
                plan.gemms.clear()
            plan.gemms[key] = lt
            return lt

    def _lt_workspace(self, torch: Any, dev: int, stream: int) -> Any:
        """cuBLASLt's workspace for one stream of ``dev`` (one per stream: two streams
        running at once must not share one), as large as the table's largest need.
        Allocated through torch, so a call inside graph capture draws it from the
        graph's pool; it is kept for the life of the process."""
        with self._lock:
            ws = self._lt_workspaces.get((dev, stream))
            if ws is None:
                size = max(
                    (e.cublaslt.workspace_bytes for e in self.table.entries if e.cublaslt),
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
        if self._table_reason is not None:
            return _Device(None, None, self._table_reason)
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

    def _plan(self, entry: TableEntry) -> _Plan:
        """The plan of one entry, with its kernel object (the cubin read from the
        package now, loaded into a context later by ``_load``)."""
        with self._lock:
            plan = self._plans.get(entry.key)
            if plan is not None:
                return plan
            plan = _Plan(entry)
            if plan.reason is None and plan.lt is None:
                self._read_kernel(plan, entry)
            if entry.eager is not None:
                alt = _Plan(entry, alt=True)
                if alt.reason is None:
                    self._read_kernel(alt, entry.eager)
                plan.eager = alt
            self._plans[entry.key] = plan
            return plan

    def _read_kernel(self, plan: _Plan, source: TableEntry | EagerAlt) -> None:
        """Give ``plan`` the kernel of ``source`` (an entry or its eager alternative), or
        the reason ``load_error`` where its cubin cannot be read."""
        try:
            plan.kernel = self._kernel(source)
        except OSError as exc:
            plan.reason = "load_error"
            self._warn_once(
                f"load:{plan.name}",
                f"{self.package}: cannot read the cubin of {plan.name} ({exc}); using torch for it",
            )

    def _kernel(self, entry: TableEntry | EagerAlt) -> driver.Kernel:
        sha, symbol = entry.cubin_sha256, entry.symbol
        kernel = self._kernels.get((sha, symbol))
        if kernel is None:
            path = importlib.resources.files(self.package).joinpath("cubins")
            cubin = path.joinpath(f"{sha}.cubin").read_bytes()
            smem = entry.launch["smem_bytes"]
            kernel = driver.Kernel(cubin, symbol, smem, expected_sha256=sha)
            self._kernels[(sha, symbol)] = kernel
        return kernel

    def _load(self, torch: Any, plan: _Plan, dev: int) -> str | None:
        """Load a plan's kernel on ``dev``; a fallback reason when it cannot be."""
        if torch.cuda.is_current_stream_capturing():
            # Loading a module during capture would break the capture.
            self._warn_once(
                "capture",
                f"{self.package}: a CUDA graph is being captured and {plan.name} is not "
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
                    f"load:{plan.name}",
                    f"{self.package}: cannot load {plan.name} ({exc}); using torch for it",
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


def bind(package: str, native_sha256: dict[str, str] | None = None) -> Api:
    """The ``Api`` of the generated package ``package`` (its import name), which ships
    ``dispatch.json`` and ``cubins/<sha256>.cubin`` (and, with ``native_sha256``, the
    native launcher's ``_native/`` files of those hashes). Reads nothing yet."""
    return Api(package, native_sha256)
