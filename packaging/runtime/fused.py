"""The torch side of the gated-activation and RMSNorm row-scale fused ops
(docs/contracts.md, ABI ``gemm_v3``): the weight packers (``pack_gate_up``,
``fold_rmsnorm``), the argument rules, torch's unfused ops (the fallback: exactly what a
user would run) and their backward (fp32 formulas, no kernel).

Self-contained (ships inside wheels as ``_runtime``): the standard library and torch,
which every function here is handed tensors of (imported at the first call).
"""

from __future__ import annotations

import math
import numbers
import threading
from typing import Any

# The gated activations ``linear_gated`` takes (its ``act``); epilogue ``act`` or, with
# the RMSNorm row scale, ``rmsnorm_<act>`` (abi.EPILOGUE_ACTIVATION).
ACTIVATIONS: tuple[str, ...] = ("silu", "gelu_tanh")


def _torch() -> Any:
    import torch  # the caller holds tensors, so this is a dictionary lookup

    return torch


def _need_tensor(op: str, name: str, t: Any) -> None:
    if not isinstance(t, _torch().Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")


def pack_gate_up(gate: Any, up: Any) -> Any:
    """The packed gate_up weight [2I, K] of ``gate`` [I, K] and ``up`` [I, K]: rows
    interleaved in pairs (row 2j is gate row j, row 2j + 1 up row j), the layout the
    gated epilogues read. A new contiguous tensor; the inputs are not changed."""
    for name, t in (("gate", gate), ("up", up)):
        _need_tensor("pack_gate_up", name, t)
        if t.dim() != 2:
            raise ValueError(f"pack_gate_up: {name} must be 2-D [I, K], got shape {tuple(t.shape)}")
    if gate.shape != up.shape:
        raise ValueError(
            f"pack_gate_up: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ in shape"
        )
    if gate.dtype != up.dtype:
        raise ValueError(f"pack_gate_up: gate is {gate.dtype} but up is {up.dtype}")
    if gate.device != up.device:
        raise ValueError(f"pack_gate_up: gate is on {gate.device} but up on {up.device}")
    i, k = gate.shape
    return _torch().stack((gate, up), 1).reshape(2 * i, k)


def fold_rmsnorm(w: Any, norm_weight: Any, offset: float = 0.0) -> Any:
    """``w`` [N, K] with an RMSNorm's weight [K] folded in:
    ``(w.float() * (norm_weight.float() + offset)).to(w.dtype)`` (``offset=1.0`` for
    Gemma's ``(1 + weight)``), so ``linear_rmsnorm(h, fold_rmsnorm(w, g), eps)`` is
    ``F.linear(rmsnorm(h) * g, w)``. A new tensor."""
    _need_tensor("fold_rmsnorm", "w", w)
    _need_tensor("fold_rmsnorm", "norm_weight", norm_weight)
    if w.dim() != 2:
        raise ValueError(f"fold_rmsnorm: w must be 2-D [N, K], got shape {tuple(w.shape)}")
    if norm_weight.dim() != 1 or norm_weight.shape[0] != w.shape[1]:
        raise ValueError(
            f"fold_rmsnorm: norm_weight must be [K] = [{w.shape[1]}] (w's K), "
            f"got shape {tuple(norm_weight.shape)}"
        )
    if not w.dtype.is_floating_point or not norm_weight.dtype.is_floating_point:
        raise ValueError(
            f"fold_rmsnorm: w ({w.dtype}) and norm_weight ({norm_weight.dtype}) must be "
            "floating point"
        )
    if w.device != norm_weight.device:
        raise ValueError(
            f"fold_rmsnorm: w is on {w.device} but norm_weight on {norm_weight.device}"
        )
    offset = check_eps("fold_rmsnorm", offset, "offset")
    return (w.float() * (norm_weight.float() + offset)).to(w.dtype)


def check_act(op: str, act: Any) -> str:
    """``act`` if it names a gated activation, else ValueError naming it."""
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"{op}: act must be one of {list(ACTIVATIONS)}, got {act!r}")
    return act


def check_eps(op: str, eps: Any, name: str = "eps") -> float:
    """``eps`` as a float if it is a finite real number (not a bool, not a tensor);
    else TypeError / ValueError naming it. The kernel takes it as a C float."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{op}: {name} must be a finite real number, got {type(eps).__name__}")
    value = float(eps)
    if not math.isfinite(value):
        raise ValueError(f"{op}: {name} must be a finite real number, got {value!r}")
    return value


def check_inputs(op: str, x: Any, w: Any, bias: Any = None, gated: bool = False) -> None:
    """The rules torch's unfused op could not compute past either: x [..., K] and w
    [N, K] tensors of one dtype and device, an even N where ``gated`` (gate, up pairs),
    a bias [N] of x's dtype and device. A clear error naming the tensor otherwise;
    everything else the kernels cannot take (strides, alignment, dtype, device, CPU...)
    falls back to torch instead."""
    _need_tensor(op, "x", x)
    _need_tensor(op, "w", w)
    if x.dim() < 1:
        raise ValueError(f"{op}: x must be [..., K], got a 0-dim tensor")
    if w.dim() != 2:
        raise ValueError(f"{op}: w must be 2-D [N, K], got shape {tuple(w.shape)}")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(
            f"{op}: x has K = {x.shape[-1]} but w {tuple(w.shape)} has K = {w.shape[1]}"
        )
    if x.dtype != w.dtype:
        raise ValueError(f"{op}: x is {x.dtype} but w is {w.dtype}")
    if x.device != w.device:
        raise ValueError(f"{op}: x is on {x.device} but w on {w.device}")
    if gated and w.shape[0] % 2:
        raise ValueError(
            f"{op}: w must be a packed gate_up weight [2I, K] (pack_gate_up), but its "
            f"N = {w.shape[0]} is odd"
        )
    if bias is None:
        return
    _need_tensor(op, "bias", bias)
    if bias.dim() != 1 or bias.shape[0] != w.shape[0]:
        raise ValueError(f"{op}: bias must be [N] = [{w.shape[0]}], got shape {tuple(bias.shape)}")
    if bias.dtype != x.dtype:
        raise ValueError(f"{op}: bias is {bias.dtype} but x is {x.dtype}")
    if bias.device != x.device:
        raise ValueError(f"{op}: bias is on {bias.device} but x on {x.device}")


# -- torch's unfused ops (the fallback) ------------------------------------------------


def rms_normed(x: Any, eps: float) -> Any:
    """torch's RMSNorm without a weight, rounded to x's dtype: x * rsqrt(mean(x^2) + eps)
    in fp32, one rounding (as a model computes it), by ``F.rms_norm``: one kernel on CUDA
    where the same formula as separate ops takes five, 9x its time (11 against 99 µs at
    2048 x 4096 on an H200, docs/kernels.md "The gated baseline"). Its sum runs in
    another order: a few outputs in a million differ by one rounding."""
    return _torch().nn.functional.rms_norm(x, (x.shape[-1],), eps=eps)


def unfused_gated(x: Any, w: Any, act: str, eps: float | None) -> Any:
    """``linear_gated``'s fallback: (RMSNorm where ``eps`` is given,) F.linear over the
    gate rows of the packed w and F.linear over its up rows (``w[0::2]``, ``w[1::2]``:
    views, no copy), then ``act(g) * u`` on their contiguous outputs: what an unpacked
    MLP runs, not one GEMM and the activation over its strided (gate, up) pairs (26%
    over the GEMM's time on an H200 at 2048x28672x4096)."""
    f = _torch().nn.functional
    xn = x if eps is None else rms_normed(x, eps)
    g, u = f.linear(xn, w[0::2]), f.linear(xn, w[1::2])
    return (f.silu(g) if act == "silu" else f.gelu(g, approximate="tanh")) * u


def unfused_rmsnorm(x: Any, w: Any, eps: float, bias: Any = None) -> Any:
    """``linear_rmsnorm``'s fallback: RMSNorm, then F.linear (with the bias)."""
    return _torch().nn.functional.linear(rms_normed(x, eps), w, bias)


# -- backward (fp32, through the unfused math; the kernels have no backward) ----------


def _rmsnorm_backward(x: Any, gxn: Any, eps: float) -> Any:
    """d/dx of xn = x * rsqrt(mean(x^2) + eps) given dL/dxn, in fp32."""
    xf = x.float()
    rs = _torch().rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return rs * gxn - xf * rs.pow(3) * (gxn * xf).mean(-1, keepdim=True)


def _linear_backward(gy: Any, xn: Any, w: Any, need: tuple[bool, bool]) -> tuple[Any, Any]:
    """dL/dxn and dL/dw of y = xn w^T (gy fp32 [..., N]; xn in its dtype)."""
    gxn = gy @ w.float() if need[0] else None
    gw = None
    if need[1]:
        gw = gy.reshape(-1, gy.shape[-1]).t() @ xn.float().reshape(-1, xn.shape[-1])
    return gxn, gw


def gated_backward(
    x: Any, w: Any, act: str, eps: float | None, grad: Any, need: tuple[bool, bool]
) -> tuple[Any, Any]:
    """(dL/dx, dL/dw) of ``linear_gated`` (None where not needed), from the unfused
    math in fp32: the activation's derivative on the pre-activation, the GEMM's, and
    the RMSNorm's where ``eps`` is given."""
    torch = _torch()
    xn = x if eps is None else rms_normed(x, eps)
    y = torch.nn.functional.linear(xn.float(), w.float())
    g, u = y.unflatten(-1, (-1, 2)).unbind(-1)
    ga = grad.float()
    if act == "silu":
        dg = torch.ops.aten.silu_backward(ga * u, g)
        a = torch.nn.functional.silu(g)
    else:
        dg = torch.ops.aten.gelu_backward(ga * u, g, approximate="tanh")
        a = torch.nn.functional.gelu(g, approximate="tanh")
    gy = torch.stack((dg, ga * a), -1).flatten(-2)
    gxn, gw = _linear_backward(gy, xn, w, need)
    gx = None
    if gxn is not None:
        gx = (gxn if eps is None else _rmsnorm_backward(x, gxn, eps)).to(x.dtype)
    return gx, None if gw is None else gw.to(w.dtype)


def rmsnorm_backward(
    x: Any, w: Any, eps: float, has_bias: bool, grad: Any, need: tuple[bool, bool, bool]
) -> tuple[Any, Any, Any]:
    """(dL/dx, dL/dw, dL/dbias) of ``linear_rmsnorm`` (None where not needed), fp32."""
    gy = grad.float()
    xn = rms_normed(x, eps)
    gxn, gw = _linear_backward(gy, xn, w, need[:2])
    gx = None if gxn is None else _rmsnorm_backward(x, gxn, eps).to(x.dtype)
    gb = None
    if has_bias and need[2]:
        gb = gy.reshape(-1, gy.shape[-1]).sum(0).to(grad.dtype)
    return gx, None if gw is None else gw.to(w.dtype), gb


# -- errors through the native kernel -------------------------------------------------

_raised = threading.local()  # a fused op's Python kernel's last error (``raised_by_python``)


def keeping_error(fn: Any) -> Any:
    """``fn`` (a fused op's Python kernel, which the native kernel calls through the
    dispatcher) keeping the exception it raises: the dispatcher hands the native kernel
    an error code, and the native kernel raises a RuntimeError with the message; the
    ``Api`` methods re-raise the original (``raised_by_python``)."""

    def kernel(*args: Any) -> Any:
        try:
            return fn(*args)
        except (TypeError, ValueError) as exc:
            _raised.exc = exc
            raise

    return kernel


def raised_by_python() -> BaseException | None:
    """The TypeError / ValueError a fused op's Python kernel raised on this thread since
    ``forget_raised()`` (None: none), forgotten now."""
    got = getattr(_raised, "exc", None)
    _raised.exc = None
    return got


def forget_raised() -> None:
    """Forget the last error a fused op's Python kernel raised on this thread."""
    _raised.exc = None
