"""The native launcher (``_native/libcudal2_native.so``, built from
``packaging/native/launcher.cpp``): the torch op's CUDA kernel in compiled code.

``attach(api, namespace, files)`` loads the package's library (its bytes checked
against the sha256 recorded at build time), looks up the CUDA driver and torch's
current-stream function, and registers the library's boxed kernels as the CUDA kernels
of ``<namespace>::linear`` / ``::matmul`` and of the fused ops ``::linear_residual`` /
``::linear_gated`` / ``::linear_rmsnorm`` (ABI gemm_v3 kernels). From then on a CUDA call
of an op runs the checks, the allocation and the launch natively; this module answers
the library's questions about a shape (and fused epilogue) it has not seen yet
(``prepare``: the table's plan, loaded on the device, or a fallback reason), which
happens once per shape, and moves the native counters into ``Api.stats`` when they are
read. A fused op's call the library does not launch goes to the op's Python kernel
(``_<op>_py``), which counts its own fallback reason.

Where the library cannot be used (not shipped, another platform, a torch older than the
stable ABI it targets, a CPU build of torch, a corrupted file), nothing is registered and
the op keeps its Python kernel (``Api.launcher`` says which path runs and why).
``CUDAL2_NATIVE=0`` sends each call of the native kernel to the Python kernel, so both
paths can be measured in one process.

Ships inside wheels as ``_runtime``: the standard library, ``torch`` (imported by the
caller first) and its own files.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.resources
import os
import threading
from collections.abc import Mapping
from typing import Any

from . import driver
from .abi import EPILOGUE_OPERANDS, GemmArgs

LIBRARY = "libcudal2_native.so"
BIAS_CUBIN = "bias.cubin"
ABI = 5  # cudal2_native_abi() of the library this file drives
# The kernel ABIs the C launcher passes parameters for (PlanDesc.abi: 1, 2, 3); gemm_v3
# kernels only for the fused ops' calls, of the epilogue the call asks for
NATIVE_ABIS = ("gemm_v1", "gemm_v2", "gemm_v3")
# The library's epilogue codes (launcher.cpp's CUDAL2_EPILOGUES; checked at load)
EPILOGUES = tuple(EPILOGUE_OPERANDS)
# launcher.cpp's FusedOp: the fused ops whose CUDA kernel the library is
FUSED_OPS = ("linear_residual", "linear_gated", "linear_rmsnorm")
DTYPES = ("fp16", "bf16")  # the library's dtype codes
LAYOUTS = ("tn", "nn")
_TRANSIENT = 1 << 20  # a reason the library must not remember (see launcher.cpp)


class PlanDesc(ctypes.Structure):
    """launcher.cpp's ``PlanDesc``, field for field (its size is checked at load)."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("abi", ctypes.c_int32),
        ("function", ctypes.c_uint64),
        ("block", ctypes.c_int32 * 3),
        ("smem", ctypes.c_int32),
        ("tile_m", ctypes.c_int32),
        ("tile_n", ctypes.c_int32),
        ("split_k", ctypes.c_int32),
        ("cluster", ctypes.c_int32 * 3),
        ("persistent", ctypes.c_int32),
        ("ctas_per_sm", ctypes.c_int32),
        ("sm_count", ctypes.c_int32),
        ("box_a", ctypes.c_int32 * 2),
        ("box_b", ctypes.c_int32 * 2),
        ("box_c", ctypes.c_int32 * 2),
        ("pdl", ctypes.c_int32),
        ("eager", ctypes.c_int32),
        ("lt_matmul", ctypes.c_uint64),
        ("lt_handle", ctypes.c_uint64),
        ("lt_desc", ctypes.c_uint64),
        ("lt_w", ctypes.c_uint64),
        ("lt_a", ctypes.c_uint64),
        ("lt_c", ctypes.c_uint64),
        ("lt_algo", ctypes.c_uint64),
        ("lt_alpha", ctypes.c_uint64),
        ("lt_beta", ctypes.c_uint64),
        ("lt_workspace_bytes", ctypes.c_uint64),
        ("bias_function", ctypes.c_uint64),
        ("epilogue", ctypes.c_int32),
        ("tma_r", ctypes.c_int32),  # 1: R's map after C's, in C's box (sm90tma's R by TMA)
    ]


PREPARE = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.c_int32,
    ctypes.c_int32,
    ctypes.c_int32,
    ctypes.c_int32,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_int32,
)
WORKSPACE = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.c_int32,
    ctypes.c_int32,
    ctypes.c_uint64,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ctypes.c_uint64),
)
EVENT = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_char_p)


class NativeUnavailable(Exception):
    """Why the native launcher cannot serve this process (one line)."""


def _read_checked(package: str, name: str, expected: str | None) -> tuple[bytes, str]:
    """The bytes and path of ``_native/<name>``, checked against the sha256 recorded at
    build time (``NativeUnavailable`` when missing or different)."""
    res = importlib.resources.files(package).joinpath("_native").joinpath(name)
    try:
        data = res.read_bytes()
    except OSError as exc:
        raise NativeUnavailable(f"{name} is not in the package ({exc.strerror or exc})") from None
    if expected is None:
        raise NativeUnavailable(f"the package records no sha256 for {name}")
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise NativeUnavailable(f"{name} is corrupted: sha256 {got} != {expected} recorded")
    return data, os.fspath(res)


_libs: dict[str, ctypes.CDLL] = {}  # path -> the loaded library (one load per file)
_load_lock = threading.Lock()


def grid_fields(desc: PlanDesc, recipe: Mapping[str, Any], sms: int) -> None:
    """The plan fields the launcher's grid is made of (``kernel_grid`` in launcher.cpp,
    as ``driver.gemm_grid``), from a kernel recipe on a GPU of ``sms`` SMs."""
    r = recipe
    desc.tile_m, desc.tile_n = int(r["tile_m"]), int(r["tile_n"])
    desc.split_k = int(r.get("split_k", 1))
    desc.cluster[:] = list(r.get("cluster") or (1, 1, 1))
    desc.persistent = int(bool(r.get("persistent")))
    desc.ctas_per_sm = int(r.get("ctas_per_sm", 1))
    desc.sm_count = sms if desc.persistent else 0
    if desc.persistent and r.get("max_ctas"):
        # The launcher's slots are sm_count x ctas_per_sm: hand it the capped count
        # as slots of one (the plan struct, and the launcher, unchanged).
        desc.sm_count = driver.persistent_slots(r, desc.sm_count)
        desc.ctas_per_sm = 1


def native_grid(lib: ctypes.CDLL, desc: PlanDesc, m: int, n: int) -> tuple[int, int, int]:
    """The grid the launcher gives a plan for an M x N output (no GPU call)."""
    out = (ctypes.c_int64 * 3)()
    lib.cudal2_native_grid(ctypes.byref(desc), ctypes.c_int64(m), ctypes.c_int64(n), out)
    return (out[0], out[1], out[2])


def _library(path: str) -> ctypes.CDLL:
    with _load_lock:
        lib = _libs.get(path)
        if lib is None:
            try:
                lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
            except OSError as exc:
                raise NativeUnavailable(f"cannot load {LIBRARY}: {exc}") from None
            got = lib.cudal2_native_abi()
            if got != ABI:
                raise NativeUnavailable(f"{LIBRARY} speaks ABI {got}, this runtime {ABI}")
            if plan_offsets(lib) != [getattr(PlanDesc, f).offset for f, _ in PlanDesc._fields_]:
                raise NativeUnavailable(f"{LIBRARY}'s plan record differs from this runtime's")
            if lib.cudal2_native_plan_bytes() != ctypes.sizeof(PlanDesc):
                raise NativeUnavailable(f"{LIBRARY}'s plan record differs from this runtime's")
            lib.cudal2_native_reason.restype = ctypes.c_char_p
            lib.cudal2_native_epilogue.restype = ctypes.c_char_p
            if epilogues(lib) != EPILOGUES:
                raise NativeUnavailable(f"{LIBRARY}'s epilogues differ from this runtime's")
            lib.cudal2_native_register.argtypes = [
                ctypes.c_char_p,
                PREPARE,
                WORKSPACE,
                EVENT,
                ctypes.c_char_p,
                ctypes.c_int,
            ]
            lib.cudal2_native_set_plan.argtypes = [
                ctypes.c_int,
                ctypes.c_int,
                ctypes.POINTER(PlanDesc),
            ]
            lib.cudal2_native_get_plan.argtypes = lib.cudal2_native_set_plan.argtypes
            lib.cudal2_native_drain.argtypes = [
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int64),
            ]
            lib.cudal2_native_operands.argtypes = [
                ctypes.c_int,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_int64,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.POINTER(ctypes.c_int64),
                ctypes.c_int64,
                ctypes.POINTER(ctypes.c_int64),
            ]
            u64, i64 = ctypes.c_uint64, ctypes.c_int64
            lib.cudal2_native_launch_loop.argtypes = [
                ctypes.c_int,
                ctypes.c_int,
                *(u64, u64, u64),
                *(i64, i64, i64, i64, i64),
                u64,
                ctypes.c_int,
            ]
            lib.cudal2_native_fused_operands.argtypes = [
                ctypes.c_int,
                *[ctypes.POINTER(TensorArg)] * 4,
                ctypes.c_char_p,
                ctypes.c_int,
                ctypes.c_double,
                ctypes.POINTER(ctypes.c_int64),
                ctypes.POINTER(ctypes.c_float),
            ]
            _libs[path] = lib
        return lib


def reasons(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The library's fallback reasons by code (``Stats``' names)."""
    return tuple(
        lib.cudal2_native_reason(i).decode() for i in range(lib.cudal2_native_num_reasons())
    )


def plan_offsets(lib: ctypes.CDLL) -> list[int]:
    """The byte offsets of the library's ``PlanDesc`` fields, in declaration order."""
    out = (ctypes.c_int64 * 64)()
    n = lib.cudal2_native_plan_offsets(out, 64)
    return list(out[:n])


def plan(lib: ctypes.CDLL, slot: int, pid: int) -> PlanDesc | None:
    """A copy of the library's plan ``pid`` of ``slot`` (tests), or None."""
    desc = PlanDesc()
    return desc if lib.cudal2_native_get_plan(slot, pid, ctypes.byref(desc)) == 0 else None


def epilogues(lib: ctypes.CDLL) -> tuple[str, ...]:
    """The library's epilogues by code (``abi.EPILOGUE_OPERANDS``' order)."""
    return tuple(
        lib.cudal2_native_epilogue(i).decode() for i in range(lib.cudal2_native_num_epilogues())
    )


class TensorArg(ctypes.Structure):
    """launcher.cpp's ``TensorArg``: a tensor's metadata for ``fused_operands``."""

    _fields_ = [
        ("ndim", ctypes.c_int64),
        ("sizes", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("dtype", ctypes.c_int32),
        ("device_type", ctypes.c_int32),
        ("device_index", ctypes.c_int32),
        ("present", ctypes.c_int32),
        ("data", ctypes.c_uint64),
    ]


def fused_operands(
    lib: ctypes.CDLL,
    op: str,
    tensors: Mapping[str, tuple | None],
    act: str | None = None,
    eps: float | None = None,
) -> tuple | str:
    """The library's checks of a fused op's call (``op`` in ``FUSED_OPS``) on tensor
    metadata: ``tensors`` maps x, w, bias, residual to (shape, strides, torch dtype code,
    device type code, device index, data pointer) or None. (layout, m, n, k, lda, ldb,
    epilogue, ldr, ldc, has bias, eps as the kernel gets it) where its kernel would be
    asked for, else the reason (``"raises"`` where the op's Python kernel raises). The
    tests compare it with the Python path's checks."""
    keep = []

    def arg(t: tuple | None) -> TensorArg:
        if t is None:
            return TensorArg()
        shape, strides, dtype, dev_type, dev_index, data = t
        sizes = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        st = (ctypes.c_int64 * max(len(strides), 1))(*strides)
        keep.extend((sizes, st))
        return TensorArg(len(shape), sizes, st, dtype, dev_type, dev_index, 1, data)

    out = (ctypes.c_int64 * 10)()
    got_eps = ctypes.c_float()
    args = [arg(tensors.get(name)) for name in ("x", "w", "bias", "residual")]
    r = lib.cudal2_native_fused_operands(
        FUSED_OPS.index(op),
        *[ctypes.byref(a) for a in args],
        None if act is None else act.encode(),
        int(eps is not None),
        0.0 if eps is None else float(eps),
        out,
        ctypes.byref(got_eps),
    )
    if r >= 0:
        names = reasons(lib)
        return names[r] if r < len(names) else "raises"
    layout, m, n, k, lda, ldb, epi, ldr, ldc, has_bias = list(out)
    return (
        LAYOUTS[layout],
        m,
        n,
        k,
        lda,
        ldb,
        EPILOGUES[epi],
        ldr,
        ldc,
        bool(has_bias),
        got_eps.value,
    )


def operands(lib: ctypes.CDLL, linear: bool, a: tuple, b: tuple) -> tuple | str:
    """The library's operand rules for shapes/strides ``a`` = (shape, strides) and ``b``:
    (layout, m, n, k, lda, ldb) or a reason, as ``abi.linear_operands`` /
    ``abi.matmul_operands`` answer (the tests compare the two)."""

    def arr(values: tuple) -> Any:
        return (ctypes.c_int64 * max(len(values), 1))(*values)

    out = (ctypes.c_int64 * 6)()
    r = lib.cudal2_native_operands(
        int(linear), arr(a[0]), arr(a[1]), len(a[0]), arr(b[0]), arr(b[1]), len(b[0]), out
    )
    if r >= 0:
        return reasons(lib)[r]
    layout, *rest = list(out)
    return (LAYOUTS[layout], *rest)


class Native:
    """One namespace's native kernels: the registration's callbacks (kept alive here),
    the plan ids handed to the library and the counters' names."""

    def __init__(self, lib: ctypes.CDLL, apis: Mapping[str, Any], namespace: str, files: dict):
        self.lib = lib
        self.namespace = namespace
        self._apis = apis  # namespace -> the Api bound now (re-bound on a second import)
        self._files = files
        self._reasons = reasons(lib)
        self._codes = {name: i for i, name in enumerate(self._reasons)}
        self._lock = threading.RLock()
        self._ids: dict[tuple, int] = {}  # (entry key, device, lt shape or None) -> id
        self._names: list[str] = []  # id -> the entry's name (stats)
        self._plans: dict[int, Any] = {}  # id -> the Python plan (its launch_error)
        self._keep: list[Any] = []  # cuBLASLt calls whose pointers the library holds
        self._bias: dict[tuple[str, int], int] = {}  # (dtype, device) -> CUfunction
        self._bias_kernels: dict[str, driver.Kernel] = {}
        self._max_plans = lib.cudal2_native_max_plans()
        self._prepare_cb = PREPARE(self._prepare)
        self._workspace_cb = WORKSPACE(self._workspace)
        self._event_cb = EVENT(self._event)
        err = ctypes.create_string_buffer(512)
        slot = lib.cudal2_native_register(
            namespace.encode(), self._prepare_cb, self._workspace_cb, self._event_cb, err, 512
        )
        if slot < 0:
            raise NativeUnavailable(err.value.decode(errors="replace"))
        self.slot = slot

    @property
    def api(self) -> Any:
        return self._apis[self.namespace]

    def forget(self) -> None:
        """Drop every plan (the namespace was re-bound to a new Api)."""
        with self._lock:
            self.lib.cudal2_native_forget(self.slot)
            self._ids.clear()
            self._names.clear()
            self._plans.clear()
            self._keep.clear()

    def drain(self, hits: Any, fallbacks: Any) -> None:
        """Move the library's counters into ``hits`` / ``fallbacks`` (Counters)."""
        with self._lock:
            n = len(self._names)
            h = (ctypes.c_int64 * max(n, 1))()
            f = (ctypes.c_int64 * len(self._reasons))()
            self.lib.cudal2_native_drain(self.slot, h, n, f)
            for i in range(n):
                if h[i]:
                    hits[self._names[i]] += h[i]
            for i, name in enumerate(self._reasons):
                if f[i]:
                    fallbacks[name] += f[i]

    # -- the library's questions (ctypes callbacks: they must never raise) -----------

    def _prepare(self, slot, dev, dtype, layout, m, n, k, lda, ldb, epilogue) -> int:
        try:
            return self._answer(
                dev, DTYPES[dtype], LAYOUTS[layout], m, n, k, lda, ldb, EPILOGUES[epilogue]
            )
        except Exception as exc:  # noqa: BLE001 - a callback must answer; warn, fall back
            self.api._warn_once(
                "native:prepare",
                f"{self.api.package}: the native launcher could not prepare "
                f"{m}x{n}x{k} ({type(exc).__name__}: {exc}); using torch for it",
            )
            return -(self._codes["load_error"] + 1)

    def _reason(self, reason: str) -> int:
        code = self._codes[reason]
        return -((code | _TRANSIENT) + 1) if reason == "capture" else -(code + 1)

    def _answer(self, dev, dtype, layout, m, n, k, lda, ldb, epilogue="none") -> int:
        api = self.api
        import torch

        with self._lock, torch.cuda.device(dev):
            shape = (dev, dtype, layout, m, n, k)
            if epilogue != "none":
                return self._answer_fused(torch, (*shape, epilogue))
            plan = api._prepare(torch, shape)
            if type(plan) is str:
                return self._reason(plan)
            if (
                plan.reason is None
                and plan.lt is None
                and plan.recipe.get("abi", "gemm_v1") not in ("gemm_v1", "gemm_v2")
            ):
                # A gemm_v3 (fused epilogue) kernel: a plain call passes no epilogue
                # operands. A plain call's lookup never finds one (the dispatch key
                # carries the epilogue); this keeps it so if that ever changes.
                return self._reason("abi")
            # The entry's eager alternative where it passed this shape (``Api._prepare``):
            # its own plan id, which the entry's plan names; the library launches it
            # when the stream is not capturing.
            alt = api._eager.get(shape) if plan.eager is not None else None
            if plan.eager is not None and alt is None and torch.cuda.is_current_stream_capturing():
                # Not loaded under capture (``Api._prepare``): a plan without it would
                # be remembered for good; this answer is not, and warmup() avoids it.
                return self._reason("capture")
            eager = -1 if alt is None else self._plan_id(alt, dev, dtype, None)
            if type(eager) is str:
                if plan.reason is not None:
                    return self._reason(eager)
                eager = -1
            if plan.reason is not None and eager < 0:
                return self._reason(plan.reason)
            lt_key = None if plan.lt is None else (m, n, k, lda, ldb)
            got = self._plan_id(plan, dev, dtype, lt_key, eager)
            return self._reason(got) if type(got) is str else got

    def _answer_fused(self, torch: Any, shape: tuple) -> int:
        """A fused op's shape (its epilogue last): the plan id of the table's gemm_v3
        kernel of exactly that epilogue, or the reason the Python path would give
        (anything else, e.g. a fallback entry with an eager alternative, which the
        Python kernel then serves: ``abi``)."""
        plan = self.api._prepare(torch, shape)
        if type(plan) is str:
            return self._reason(plan)
        if plan.reason is not None:
            return self._reason(plan.reason)
        r = plan.recipe
        if plan.lt is not None or r.get("abi") != "gemm_v3" or r.get("epilogue") != shape[6]:
            return self._reason("abi")
        got = self._plan_id(plan, shape[0], shape[1], None)
        return self._reason(got) if type(got) is str else got

    def _plan_id(
        self, plan: Any, dev: int, dtype: str, lt_key: tuple | None, eager: int = -1
    ) -> int | str:
        """The library's id of ``plan`` on ``dev`` (set there on first use), or a
        fallback reason. ``eager``: the id of the plan to launch in its place when the
        stream is not capturing (-1: none); a plan with a reason (a fallback entry) is
        then torch's GEMM under capture (kind 0)."""
        key = (plan.name, dev, lt_key, eager)
        pid = self._ids.get(key)
        if pid is not None:
            return pid
        if plan.reason is None and plan.lt is None and plan.recipe.get("workspace_per_cta"):
            # A stream-K kernel takes a workspace, which this launcher does not pass yet:
            # torch serves the call here (the Python path launches it: CUDAL2_NATIVE=0).
            return "abi"
        if len(self._names) >= self._max_plans:
            return "fits"
        desc = PlanDesc()
        desc.bias_function = self._bias_function(dtype, dev)
        desc.eager = eager + 1  # 0: none (a zeroed record)
        if plan.reason is not None:
            desc.kind = 0
        elif plan.lt is None:
            self._kernel_plan(desc, plan, dev)
        else:
            m, n, k, lda, ldb = lt_key
            lt = self.api._lt_gemm(plan, dev, GemmArgs(0, 0, 0, m, n, k, lda, ldb, n))
            if type(lt) is str:
                return lt
            self._lt_plan(desc, self.api, dev, lt)
        pid = len(self._names)
        if self.lib.cudal2_native_set_plan(self.slot, pid, ctypes.byref(desc)) != 0:
            return "fits"
        self._ids[key] = pid
        self._names.append(plan.name)
        self._plans[pid] = plan
        return pid

    def _kernel_plan(self, desc: PlanDesc, plan: Any, dev: int) -> None:
        r = plan.recipe
        desc.kind = 1
        desc.abi = NATIVE_ABIS.index(r.get("abi", "gemm_v1")) + 1
        desc.function = int(plan.kernel.function(dev))
        desc.block[:] = list(r["block"])
        desc.smem = int(r["smem_bytes"])
        grid_fields(desc, r, driver.sm_count(dev) if r.get("persistent") else 0)
        if desc.abi >= 2:  # the tensor maps of gemm_v2 and gemm_v3
            desc.box_a[:] = list(r["tma"]["a"])
            desc.box_b[:] = list(r["tma"]["b"])
            if "c" in r["tma"]:  # C's map after B's (a kernel that stores by TMA)
                desc.box_c[:] = list(r["tma"]["c"])
            desc.tma_r = int("r" in r["tma"])  # R's map after C's (the table: C's box)
        desc.pdl = int(r.get("pdl") is True)  # as driver.launch_gemm reads it
        desc.epilogue = EPILOGUES.index(r.get("epilogue", "none"))

    def _lt_plan(self, desc: PlanDesc, api: Any, dev: int, lt: Any) -> None:
        from . import cublaslt

        desc.kind = 2
        desc.lt_matmul = cublaslt.matmul_address()
        desc.lt_handle = api._lt_handles[dev]
        d = lt.desc
        desc.lt_desc, desc.lt_w, desc.lt_a, desc.lt_c = d.op, d.w, d.a, d.c
        desc.lt_algo, desc.lt_alpha, desc.lt_beta = lt.algo_ptr, d.alpha, d.beta
        desc.lt_workspace_bytes = lt.workspace_bytes
        self._keep.append(lt)

    def _bias_function(self, dtype: str, dev: int) -> int:
        """The bias kernel for ``dtype`` on ``dev`` (0 when it cannot be loaded: a call
        with a bias then falls back, reason ``bias``)."""
        fn = self._bias.get((dtype, dev))
        if fn is None:
            try:
                kernel = self._bias_kernels.get(dtype)
                if kernel is None:
                    data, _ = self._files[BIAS_CUBIN]  # checked against this hash
                    sha = self.api.native_sha256[BIAS_CUBIN]
                    kernel = driver.Kernel(data, f"cudal2_bias_add_{dtype}", 0, sha)
                    self._bias_kernels[dtype] = kernel
                fn = int(kernel.function(dev))
            except (driver.CudaDriverError, ImportError, KeyError):
                fn = 0
            self._bias[(dtype, dev)] = fn
        return fn

    def _workspace(self, slot, dev, stream, ptr, size) -> int:
        try:
            import torch

            ws = self.api._lt_workspace(torch, dev, stream)
            ptr[0], size[0] = ws.data_ptr(), ws.numel()
            return 0
        except Exception:  # noqa: BLE001 - a callback must answer: the call falls back
            return 1

    def _event(self, slot, pid, code, message) -> None:
        try:
            plan = self._plans.get(pid)
            name = plan.name if plan is not None else f"plan {pid}"
            if plan is not None:
                plan.reason = "launch_error"
            self.api._warn_once(
                f"launch:{name}",
                f"{self.api.package}: launching {name} failed ({message.decode(errors='replace')})"
                "; using the fallback for it",
            )
        except Exception:  # noqa: BLE001, S110 - a callback must not raise
            pass


def attach(api: Any, apis: Mapping[str, Any], namespace: str, package: str) -> Native:
    """Load the package's native launcher and register its CUDA kernels for
    ``namespace`` (whose ops, with ``_linear_py`` / ``_matmul_py`` and the fused ops'
    ``_<op>_py``, are defined). Raises
    ``NativeUnavailable`` with the reason where it cannot serve."""
    import torch

    if not torch.cuda.is_available() and not getattr(torch.version, "cuda", None):
        raise NativeUnavailable("torch is a CPU build")
    recorded = getattr(api, "native_sha256", None) or {}
    files = {LIBRARY: _read_checked(package, LIBRARY, recorded.get(LIBRARY))}
    with contextlib.suppress(NativeUnavailable):  # without it a bias falls back ("bias")
        files[BIAS_CUBIN] = _read_checked(package, BIAS_CUBIN, recorded.get(BIAS_CUBIN))
    lib = _library(files[LIBRARY][1])
    err = ctypes.create_string_buffer(512)
    if lib.cudal2_native_init(err, 512) != 0:
        raise NativeUnavailable(err.value.decode(errors="replace"))
    return Native(lib, apis, namespace, files)
