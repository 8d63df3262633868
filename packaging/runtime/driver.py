"""Load cubins and launch `gemm_v1` / `gemm_v2` / `gemm_v3` kernels through the CUDA driver API
(cuda-python).

Self-contained: this file ships inside generated wheels, so it imports nothing from
cudal2, only the standard library and ``cuda.bindings``. Importing it touches no
CUDA; the driver is initialised at the first load.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from .abi import (
    EPILOGUE_ABI,
    INT_MAX,
    LIMITS,
    ROPE_KV,
    ROW_SCALED,
    EpilogueArgs,
    GemmArgs,
    out_columns,
)

# Parameter types of ABI gemm_v1, in GemmArgs' order: (A, B, C, M, N, K, lda, ldb, ldc).
GEMM_V1_TYPES = (
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_longlong,
    ctypes.c_longlong,
    ctypes.c_longlong,
)
# ABI gemm_v2 appends two tensor maps (CUtensorMap, passed by pointer: type None), and a
# third, of C, where the recipe's ``tma`` has a ``c`` box (a kernel storing by TMA).
GEMM_V2_TYPES = (*GEMM_V1_TYPES, None, None)
# ABI gemm_v3 appends a fused epilogue's operands: bias, residual (null when unused), ldr.
GEMM_V3_TYPES = (*GEMM_V2_TYPES, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong)
# ... and, for an RMSNorm row-scale epilogue (abi.ROW_SCALED) only, the norm's eps.
GEMM_V3_ROW_SCALED_TYPES = (*GEMM_V3_TYPES, ctypes.c_float)
# ... and, after eps, a ROPE_KV epilogue's operands (abi.RopeKvArgs, strides spread):
# cos, sin, k_cache, v_cache, positions; seq, cos_batch, cache_len, q_heads, kv_heads,
# head_dim; the K cache's three outer strides, the V cache's.
GEMM_V3_ROPE_KV_TYPES = (
    *GEMM_V3_ROW_SCALED_TYPES,
    *(ctypes.c_void_p,) * 5,
    *(ctypes.c_int,) * 6,
    *(ctypes.c_longlong,) * 6,
)


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the error."""


def _driver() -> Any:
    from cuda.bindings import driver  # imported late: importing this module touches no CUDA

    return driver


def _check(result: tuple, what: str) -> Any:
    drv = _driver()
    err = result[0]
    if err != drv.CUresult.CUDA_SUCCESS:
        _, name = drv.cuGetErrorName(err)
        raise CudaDriverError(f"{what} failed: {name.decode() if name else err}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


_init_lock = threading.Lock()
_initialised = False


def ensure_context(device: int) -> int:
    """Make a context current for ``device`` (the primary one, as torch and CuPy use)
    if none is, and return the current context's handle."""
    global _initialised
    drv = _driver()
    with _init_lock:
        if not _initialised:
            _check(drv.cuInit(0), "cuInit")
            _initialised = True
    ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        dev = _check(drv.cuDeviceGet(device), "cuDeviceGet")
        ctx = _check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return int(ctx)


def driver_version() -> tuple[int, int]:
    """The installed driver's CUDA version as (major, minor)."""
    drv = _driver()
    _check(drv.cuInit(0), "cuInit")
    v = _check(drv.cuDriverGetVersion(), "cuDriverGetVersion")
    return v // 1000, (v % 1000) // 10


class Kernel:
    """One kernel symbol of one cubin, loaded lazily once per CUDA context.

    ``expected_sha256``, when given, is checked against the cubin bytes before the
    first load, so a corrupted install fails loudly instead of running bad code.
    """

    def __init__(
        self, cubin: bytes, symbol: str, smem_bytes: int, expected_sha256: str | None = None
    ):
        self._cubin = cubin
        self.symbol = symbol
        self.smem_bytes = smem_bytes
        self._expected = expected_sha256
        self._functions: dict[int, Any] = {}
        self._modules: list[Any] = []
        self._lock = threading.Lock()

    def function(self, device: int = 0) -> Any:
        """The CUfunction in the current context (loaded on first use, outside any hot path)."""
        ctx = ensure_context(device)
        fn = self._functions.get(ctx)
        if fn is not None:
            return fn
        with self._lock:
            fn = self._functions.get(ctx)
            if fn is None:
                fn = self._load()
                self._functions[ctx] = fn
        return fn

    def _load(self) -> Any:
        drv = _driver()
        if self._expected is not None:
            got = hashlib.sha256(self._cubin).hexdigest()
            if got != self._expected:
                raise CudaDriverError(
                    f"cubin for {self.symbol} is corrupted: sha256 {got} != {self._expected}"
                )
        module = _check(drv.cuModuleLoadData(self._cubin), f"cuModuleLoadData({self.symbol})")
        self._modules.append(module)
        fn = _check(
            drv.cuModuleGetFunction(module, self.symbol.encode()),
            f"cuModuleGetFunction({self.symbol})",
        )
        if self.smem_bytes > 48 * 1024:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(
                drv.cuFuncSetAttribute(fn, attr, self.smem_bytes),
                f"cuFuncSetAttribute({self.symbol}, smem={self.smem_bytes})",
            )
        return fn

    def launch(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        stream: int,
        args: tuple,
        types: tuple = GEMM_V1_TYPES,
        device: int = 0,
        pdl: bool = False,
    ) -> None:
        """Launch on ``stream`` (a raw cudaStream_t handle; 0 is the legacy default).

        ``pdl``: with programmatic stream serialization (``cuLaunchKernelEx``), so the
        kernel may start while the previous one on the stream runs; only for kernels
        that wait (griddepcontrol.wait) before reading inputs or writing outputs. A
        plain launch stays ``cuLaunchKernel``, its cost unchanged."""
        drv = _driver()
        fn = self.function(device)
        if pdl:
            _check(
                drv.cuLaunchKernelEx(
                    pdl_config(grid, block, self.smem_bytes, stream), fn, (args, types), 0
                ),
                f"cuLaunchKernelEx({self.symbol}, programmatic stream serialization)",
            )
            return
        _check(
            drv.cuLaunchKernel(
                fn,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                self.smem_bytes,
                drv.CUstream(stream),
                (args, types),
                0,
            ),
            f"cuLaunchKernel({self.symbol})",
        )


def pdl_config(
    grid: tuple[int, int, int], block: tuple[int, int, int], smem_bytes: int, stream: int
) -> Any:
    """The ``CUlaunchConfig`` of a PDL launch: the grid, block, dynamic shared memory
    and stream, and one attribute, programmatic stream serialization allowed (inside a
    stream capture it becomes a programmatic edge of the graph)."""
    drv = _driver()
    attr = drv.CUlaunchAttribute()
    attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    config = drv.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = smem_bytes
    config.hStream = drv.CUstream(stream)
    config.attrs = [attr]
    config.numAttrs = 1
    return config


_sm_counts: dict[int, int] = {}


def sm_count(device: int = 0) -> int:
    """The device's multiprocessor count (asked once per device; no stream work)."""
    n = _sm_counts.get(device)
    if n is None:
        drv = _driver()
        ensure_context(device)
        dev = _check(drv.cuDeviceGet(device), "cuDeviceGet")
        attr = drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        n = int(_check(drv.cuDeviceGetAttribute(attr, dev), "cuDeviceGetAttribute"))
        _sm_counts[device] = n
    return n


def _tiles(recipe: Mapping[str, Any], m: int, n: int) -> tuple[int, int]:
    """Output tiles of a recipe along N and M."""
    return -(-n // recipe["tile_n"]), -(-m // recipe["tile_m"])


def _whole_clusters(recipe: Mapping[str, Any], gx: int, gy: int) -> tuple[int, int]:
    """(gx, gy) rounded up to whole clusters of the recipe's compile-time cluster
    shape: a cluster along M (cluster [1, 2, 1]) may hold a CTA past the last tile,
    which the kernel runs for its cluster partner and stores nothing from."""
    cx, cy = (recipe.get("cluster") or [1, 1, 1])[:2]
    return -(-gx // cx) * cx, -(-gy // cy) * cy


def persistent_slots(recipe: Mapping[str, Any], sms: int) -> int:
    """CTAs a persistent recipe launches at most on a GPU of ``sms`` SMs: one per SM
    slot (``ctas_per_sm`` a SM), capped by ``max_ctas`` where the recipe has it (sm90tma
    v5's ``ctas`` knob; a recipe without the key, every older wheel's, is uncapped)."""
    slots = sms * int(recipe.get("ctas_per_sm", 1))
    cap = recipe.get("max_ctas")
    return min(slots, int(cap)) if cap else slots


def persistent_grid(recipe: Mapping[str, Any], m: int, n: int, sms: int) -> int:
    """CTAs (grid x) of a persistent recipe on a GPU of ``sms`` SMs: one per tile up to
    the slots (``persistent_slots``). A recipe with a cluster along x (sm90tma's
    persistent multicast pair, cluster [2, 1, 1]) launches whole clusters, each walking
    pair tiles (ceil(M tiles / 2) x N tiles): 2 x min(pair tiles, slots / 2); a stream-K
    recipe (``streamk``) every slot, fewer tiles than slots cut along K; every other
    recipe (cluster [1, ...] or none) launches exactly as before."""
    gx, gy = _tiles(recipe, m, n)
    slots = persistent_slots(recipe, sms)
    if recipe.get("streamk"):
        return slots
    cx = int((recipe.get("cluster") or [1, 1, 1])[0])
    if cx <= 1:
        return min(gx * gy, slots)
    cluster_tiles = -(-gy // cx) * gx
    return cx * min(cluster_tiles, max(1, slots // cx))


def gemm_grid(recipe: Mapping[str, Any], m: int, n: int, device: int = 0) -> tuple[int, int, int]:
    """Grid of a gemm launch recipe for an M x N output: one CTA per output tile (and
    K split), in whole clusters; a persistent recipe launches one CTA per SM slot (at
    most ``max_ctas``), at most one per tile (``persistent_grid``: a persistent
    cluster's grid, whole clusters)."""
    gx, gy = _tiles(recipe, m, n)
    if recipe.get("persistent"):
        return (persistent_grid(recipe, m, n, sm_count(device)), 1, 1)
    return (*_whole_clusters(recipe, gx, gy), recipe.get("split_k", 1))


def gemm_fits(recipe: Mapping[str, Any], m: int, n: int, k: int) -> bool:
    """Whether the grid and the int parameters of the gemm ABIs can hold this size."""
    gx, gy = _tiles(recipe, m, n)
    if recipe.get("persistent"):
        return max(m, n, k) <= INT_MAX and gx * gy <= INT_MAX  # tile index is an int
    gy_max = LIMITS.grid_dims[1]
    return max(m, n, k) <= INT_MAX and _whole_clusters(recipe, gx, gy)[1] <= gy_max


_workspaces: dict[tuple[int, int], tuple[int, int]] = {}  # (device, stream) -> (ptr, bytes)
_zeroing: dict[int, Any] = {}  # device -> the stream a workspace made under capture is zeroed on
_workspace_lock = threading.Lock()


def workspace_bytes(recipe: Mapping[str, Any], grid_x: int) -> int:
    """The workspace a launch of ``grid_x`` CTAs of ``recipe`` needs (0: none; a stream-K
    kernel's ``workspace_per_cta`` a CTA: its parked sums and its flag)."""
    return grid_x * int(recipe.get("workspace_per_cta", 0))


def stream_workspace(device: int, stream: int, nbytes: int) -> int:
    """A zeroed device buffer of at least ``nbytes`` for the stream-K kernels launched on
    ``stream`` of ``device`` (one a stream: two streams running at once must not share
    one; the kernels leave it zeroed again). Made on first use, before anything queued
    after it, and kept for the life of the process (a captured graph holds its address),
    a larger one replacing it where a launch needs more. While ``stream`` is being
    captured, it is made outside the capture (the thread's capture mode relaxed for the
    allocation, as torch's allocator does) and zeroed on a stream of its own, waited
    for: the graph holds neither, and an eager launch on the stream later finds it
    zeroed too."""
    key = (device, stream)
    with _workspace_lock:
        got = _workspaces.get(key)
        if got is not None and got[1] >= nbytes:
            return got[0]
        drv = _driver()
        ensure_context(device)
        status = _check(drv.cuStreamIsCapturing(drv.CUstream(stream)), "cuStreamIsCapturing")
        if status == drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE:
            ptr = int(_check(drv.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes}) (stream-K workspace)"))
            _check(
                drv.cuMemsetD8Async(ptr, 0, nbytes, drv.CUstream(stream)),
                f"cuMemsetD8Async({nbytes}) (stream-K workspace)",
            )
        else:
            relaxed = drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
            mode = _check(drv.cuThreadExchangeStreamCaptureMode(relaxed), "capture mode")
            try:
                ptr = int(
                    _check(drv.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes}) (stream-K workspace)")
                )
                zero = _zeroing.get(device)
                if zero is None:
                    flags = drv.CUstream_flags.CU_STREAM_NON_BLOCKING
                    zero = _zeroing[device] = _check(drv.cuStreamCreate(flags), "cuStreamCreate")
                _check(drv.cuMemsetD8Async(ptr, 0, nbytes, zero), "cuMemsetD8Async (workspace)")
                _check(drv.cuStreamSynchronize(zero), "cuStreamSynchronize (workspace)")
            finally:
                _check(drv.cuThreadExchangeStreamCaptureMode(mode), "capture mode")
        _workspaces[key] = (ptr, nbytes)  # a smaller one before it stays allocated
        return ptr


_TMAP_CACHE_MAX = 4096
_tmaps: OrderedDict[tuple[int, ...], Any] = OrderedDict()
_tmap_lock = threading.Lock()


def swizzle_bytes(box: tuple[int, int]) -> int:
    """A box's swizzle: its row's bytes where that is 32 or 64 (the TMA store's boxes of
    16 and 32 columns), else 128 (every A and B box: 64 k). The kernels lay out shared
    memory for the same rule (sm90tma's store template)."""
    row = box[0] * LIMITS.element_bytes
    return row if row in (32, 64) else 128


def tensor_map(ptr: int, rows: int, k: int, ld: int, box: tuple[int, int]) -> Any:
    """The TMA descriptor of a K-major [rows, k] matrix of 2-byte elements with row
    stride ``ld`` (elements), read in boxes of [box[0] k, box[1] rows] with the
    swizzle of a box row's bytes (``swizzle_bytes``: 128 for the A and B boxes of 64 k;
    64 or 32 for the TMA store's narrow boxes of C); the TMA engine fills out-of-bounds
    elements with zeros.

    Encoding is host-only work (no GPU call, safe during graph capture); descriptors
    are cached by (pointer, shape, stride, box), most recent kept, so a weight's
    descriptor is encoded once.
    """
    key = (ptr, rows, k, ld, box[0], box[1])
    with _tmap_lock:
        tmap = _tmaps.get(key)
        if tmap is not None:
            _tmaps.move_to_end(key)
            return tmap
    drv = _driver()
    tmap = _check(
        drv.cuTensorMapEncodeTiled(
            drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16,  # fp16 and bf16 alike
            2,
            ptr,
            [drv.cuuint64_t(k), drv.cuuint64_t(rows)],
            [drv.cuuint64_t(2 * ld)],
            [drv.cuuint32_t(box[0]), drv.cuuint32_t(box[1])],
            [drv.cuuint32_t(1), drv.cuuint32_t(1)],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{swizzle_bytes(box)}B"),
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
        f"cuTensorMapEncodeTiled(rows={rows}, k={k}, ld={ld}, box={list(box)})",
    )
    with _tmap_lock:
        _tmaps[key] = tmap
        if len(_tmaps) > _TMAP_CACHE_MAX:
            _tmaps.popitem(last=False)
    return tmap


def launch_gemm(
    kernel: Kernel,
    recipe: Mapping[str, Any],
    gemm: GemmArgs,
    stream: int,
    device: int = 0,
    epilogue: EpilogueArgs | None = None,
) -> None:
    """Launch a gemm_v1, gemm_v2 or gemm_v3 kernel by its recipe (grid from the tile
    shape; the tensor maps from the recipe's boxes; gemm_v3's epilogue operands from
    ``epilogue``, which must give every operand the recipe's ``epilogue`` reads, and
    its ``eps`` only where that epilogue is ROW_SCALED, its ``rope_kv`` only where it is
    ROPE_KV; C's tensor map, after B's, where the recipe's ``tma`` has a ``c`` box, and
    R's, after C's, where it has an ``r`` box);
    never synchronises. The grid
    tiles the GEMM's N (the packed 2I of a gated epilogue); ``gemm.ldc`` is the output's
    row stride (N / 2 for a gated one)."""
    args: tuple = gemm  # gemm_v1's parameter block as it stands
    types: tuple = GEMM_V1_TYPES
    abi = recipe.get("abi")
    name = recipe.get("epilogue", "none")
    if abi == EPILOGUE_ABI:  # refused before any tensor map is encoded
        missing = epilogue.missing(name) if epilogue is not None else [name]
        if missing:
            # A kernel that adds an operand it was not given would read address 0.
            raise ValueError(f"a {EPILOGUE_ABI} kernel of epilogue {name!r} needs {missing}")
    elif epilogue is not None and any(epilogue):
        raise ValueError(f"an {abi or 'gemm_v1'} kernel takes no epilogue operands")
    if abi in ("gemm_v2", EPILOGUE_ABI):
        boxes = recipe["tma"]
        maps = [
            tensor_map(gemm.a, gemm.m, gemm.k, gemm.lda, tuple(boxes["a"])),
            tensor_map(gemm.b, gemm.n, gemm.k, gemm.ldb, tuple(boxes["b"])),
        ]
        if "c" in boxes:  # C [M, N], a gated activation's [M, N / 2] (the table refuses RoPE's)
            columns = out_columns(name, gemm.n)
            maps.append(tensor_map(gemm.c, gemm.m, columns, gemm.ldc, tuple(boxes["c"])))
        if "r" in boxes:  # R [M, N] (row stride ldr), read by TMA (the table: C's box)
            if epilogue is None or not epilogue.residual:
                raise ValueError(f"a kernel of tma box 'r' needs the residual, got {epilogue}")
            r_box = tuple(boxes["r"])
            maps.append(tensor_map(epilogue.residual, gemm.m, gemm.n, epilogue.ldr, r_box))
        args = (*gemm, *maps)
        types = (*GEMM_V1_TYPES, *(None,) * len(maps))
    if abi == EPILOGUE_ABI:
        assert epilogue is not None  # (checked above)
        # gemm_v2's parameters (with C's map where there is one), then the epilogue's
        if name in ROPE_KV:
            # bias, residual, ldr, eps, then RoPE's and the caches' operands
            args = (*args, *epilogue[:4], *epilogue.rope_kv.flat())
            tail = GEMM_V3_ROPE_KV_TYPES
        elif name in ROW_SCALED:
            args = (*args, *epilogue[:4])  # bias, residual, ldr, then the float eps
            tail = GEMM_V3_ROW_SCALED_TYPES
        else:
            args = (*args, *epilogue[:3])  # no eps: the kernel has no such parameter
            tail = GEMM_V3_TYPES
        types = (*types, *tail[len(GEMM_V2_TYPES) :])
    grid = gemm_grid(recipe, gemm.m, gemm.n, device)
    if recipe.get("workspace_per_cta"):  # a stream-K kernel's workspace, its last parameter
        nbytes = workspace_bytes(recipe, grid[0])
        args = (*args, stream_workspace(device, stream, nbytes))
        types = (*types, ctypes.c_void_p)
    if recipe.get("pdl") is True:  # the table schema allows only true or false
        kernel.launch(grid, tuple(recipe["block"]), stream, args, types, device, pdl=True)
    else:
        kernel.launch(grid, tuple(recipe["block"]), stream, args, types, device)
