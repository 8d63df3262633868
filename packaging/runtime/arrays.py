"""``matmul`` / ``linear`` on arrays that are not torch tensors: CuPy arrays, and any
array that speaks DLPack (``__dlpack__``) or ``__cuda_array_interface__`` (taken by
CuPy without a copy). No torch is needed.

The same dispatch table and kernels serve them (``Api._dispatch``), on CuPy's current
stream of the array's device, and the output is a CuPy array. Whatever the table does
not cover, or the kernels cannot take, goes to CuPy's own ``matmul`` (cuBLAS): as with
torch, a fallback is never a wrong answer. CuPy has no bfloat16, so these paths are
fp16 (and CuPy's fallback for other dtypes).

``CupyAsTorch`` is the small part of torch's interface the first-use code of ``Api``
calls (capture state, device context and properties, a byte buffer), made of CuPy.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from .abi import Operands, disabled, linear_operands, matmul_operands, misaligned

_cp: Any = None


# DLPack device types of memory a kernel cannot read: kDLCPU, kDLCUDAHost (pinned).
_HOST_DEVICES = (1, 3)


def cupy(package: str = "cudal2_kernels_<name>") -> Any:
    """CuPy, imported on first use; without it, the ImportError names the wheel's
    extra that installs it (``[cupy]``), or torch's (``[torch]``)."""
    global _cp
    if _cp is None:
        try:
            import cupy as cp
        except ImportError as exc:
            if importlib.util.find_spec("torch") is not None:
                raise ImportError(
                    f"{package} takes torch tensors, or other GPU arrays (DLPack, CUDA "
                    "array interface) through CuPy, which is not installed: pass torch "
                    f"tensors (torch.from_dlpack(x)) or pip install '{package}[cupy]'"
                ) from exc
            raise ImportError(
                f"{package} takes torch tensors (torch), or CuPy/DLPack arrays through "
                f"CuPy, and neither is installed: pip install '{package}[torch]' or "
                f"'{package}[cupy]'"
            ) from exc
        _cp = cp
    return _cp


def host_array(x: Any) -> bool:
    """Whether ``x`` is an array in host memory (NumPy's, or any whose DLPack device
    is the CPU): no kernel can read it, and torch refuses it as a non-tensor."""
    if x is None or hasattr(x, "__cuda_array_interface__"):
        return False
    device = getattr(x, "__dlpack_device__", None)
    if device is None:
        return False
    try:
        return int(device()[0]) in _HOST_DEVICES
    except Exception:  # noqa: BLE001 - a broken __dlpack_device__: let CuPy say what it is
        return False


def refuse_host(*arrays: Any) -> None:
    """Raise torch's ``TypeError`` for host arrays, saying how to move them."""
    for x in arrays:
        if host_array(x):
            kind = type(x).__module__.split(".")[0]
            raise TypeError(
                f"{kind} arrays are host memory: move them to the GPU "
                "(torch.from_numpy(x).cuda() or cupy.asarray(x))"
            )


def is_foreign(x: Any) -> bool:
    """An array for this module: not a torch tensor (subclasses included), and CuPy
    can take it."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return False
    return hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__")


def as_cupy(x: Any) -> Any:
    cp = cupy()
    if isinstance(x, cp.ndarray):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cp.asarray(x)  # no copy
    return cp.from_dlpack(x)


class _Buffer:
    __slots__ = ("array",)

    def __init__(self, array: Any):
        self.array = array

    def data_ptr(self) -> int:
        return self.array.data.ptr

    def numel(self) -> int:
        return self.array.size


class _Cuda:
    def __init__(self, cp: Any):
        self._cp = cp

    def is_current_stream_capturing(self) -> bool:
        return bool(self._cp.cuda.get_current_stream().is_capturing())

    def device(self, dev: int) -> Any:
        return self._cp.cuda.Device(dev)

    def current_device(self) -> int:
        return self._cp.cuda.runtime.getDevice()

    def get_device_capability(self, dev: int) -> tuple[int, int]:
        props = self._cp.cuda.runtime.getDeviceProperties(dev)
        return int(props["major"]), int(props["minor"])

    def get_device_name(self, dev: int) -> str:
        name = self._cp.cuda.runtime.getDeviceProperties(dev)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)


class CupyAsTorch:
    """What ``Api``'s first-use code asks of torch, answered by CuPy."""

    uint8 = "uint8"

    def __init__(self, cp: Any):
        self._cp = cp
        self.cuda = _Cuda(cp)

    def empty(self, size: int, dtype: Any = None, device: str = "cuda:0") -> _Buffer:
        with self._cp.cuda.Device(int(str(device).rpartition(":")[2] or 0)):
            return _Buffer(self._cp.empty(size, dtype=self._cp.uint8))


_be: CupyAsTorch | None = None


def _stream(dev: int) -> int:
    return cupy().cuda.get_current_stream().ptr


def _operands(cp: Any, a: Any, b: Any, kind: str) -> Operands | str:
    """The operands of ``a @ b`` (kind matmul) or ``a @ b.T`` (kind linear: a [..., K]
    collapsed to 2-D, b [N, K]) by the ABI's rules, or a fallback reason."""
    if disabled():
        return "disabled"
    if a.dtype != cp.float16 or b.dtype != cp.float16:
        return "dtype"
    item = a.itemsize
    if any(s % item for s in (*a.strides, *b.strides)):
        return "stride"  # a byte stride between elements: no element stride at all
    strides_a = tuple(s // item for s in a.strides)
    strides_b = tuple(s // item for s in b.strides)
    of = linear_operands if kind == "linear" else matmul_operands
    got = of(a.shape, strides_a, b.shape, strides_b)
    if type(got) is str:
        return got
    if misaligned(a.data.ptr, b.data.ptr):
        return "alignment"
    if a.device.id != b.device.id:
        return "device"
    return got


def run(api: Any, kind: str, a: Any, b: Any, bias: Any = None) -> Any:
    """``kind`` matmul (a @ b) or linear (a @ b.T + bias) of non-torch arrays; a CuPy
    array on CuPy's current stream."""
    global _be
    refuse_host(a, b, bias)
    cp = cupy(api.package)
    a, b = as_cupy(a), as_cupy(b)
    if bias is not None:
        bias = as_cupy(bias)
    got = _operands(cp, a, b, kind)
    ok = type(got) is tuple
    if ok and bias is not None and (bias.dtype != a.dtype or bias.shape != (got[2],)):
        got = "bias"
    if type(got) is tuple:
        layout, m, n, k, lda, ldb = got
        dev = a.device.id
        if _be is None:
            _be = CupyAsTorch(cp)

        def alloc() -> _Buffer:
            with cp.cuda.Device(dev):
                return _Buffer(cp.empty((m, n), dtype=a.dtype))

        with cp.cuda.Device(dev):
            shape = (dev, "fp16", layout, m, n, k)
            out = api._dispatch(_be, shape, a.data.ptr, b.data.ptr, lda, ldb, alloc, _stream)
        if type(out) is not str:
            c = out.array
            if bias is not None:
                c += bias
            return c if kind == "matmul" or a.ndim == 2 else c.reshape(*a.shape[:-1], n)
        got = out
    api.stats._fallbacks[got] += 1
    if kind == "matmul":
        return cp.matmul(a, b)
    c = cp.matmul(a, b.T)
    return c if bias is None else c + bias
