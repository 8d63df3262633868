"""The package's torch custom ops, and routing a model's ``nn.Linear`` layers to them.

``register(api, namespace)`` defines ``torch.ops.<namespace>.linear(x, w, bias=None)``,
``torch.ops.<namespace>.matmul(a, b)`` and ``torch.ops.<namespace>.linear_residual(x, w,
residual, bias=None)`` (= linear + residual: a fused-epilogue kernel where the table has
one, else torch's two ops), and likewise
``torch.ops.<namespace>.linear_gated(x, w, act, eps=None)`` and
``torch.ops.<namespace>.linear_rmsnorm(x, w, eps, bias=None)`` (``Api.linear_gated`` /
``Api.linear_rmsnorm``) (namespace ``cudal2_<manifest name>``):

- the CPU and CUDA kernels are ``Api.op_linear`` / ``Api.op_matmul``: dispatch by shape
  inside the op, torch's own result for whatever the table does not cover or the
  kernels cannot take (so CPU tensors work, through torch);
- a fake implementation (output shape, dtype and device only), so the ops trace under
  ``torch.compile(fullgraph=True)`` and export;
- a backward (torch's GEMMs; for linear_gated / linear_rmsnorm the unfused math's
  formulas in fp32, ``fused.gated_backward`` / ``fused.rmsnorm_backward``), so the ops
  can sit in a model that trains: the forward runs the kernel even when inputs require
  grad.

Registration needs torch but no GPU, and touches no CUDA. The op definitions live for
the process; importing the package again (or a second copy of it) re-binds the
namespace to the newest ``Api`` instead of defining the ops twice.

``patch_linear(model, api, namespace)`` swaps the class of every ``nn.Linear`` whose
(N, K, dtype) the table covers for a subclass whose forward calls the op (under
torch.compile, or where autograd records), else ``Api.linear`` directly (the same
dispatch, without the dispatcher's cost); the returned ``LinearPatch`` restores them
(also as a context manager).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from . import fused, native, rope_kv
from .abi import native_off
from .api import dtype_name

_REGISTRY = "_cudal2_torch_ops"  # a process-wide module: the ops' bindings


def _registry() -> Any:
    reg = sys.modules.get(_REGISTRY)
    if reg is None:
        reg = types.ModuleType(_REGISTRY, "cudal2 torch op namespaces -> their Api")
        reg.apis = {}  # namespace -> Api
        reg.libs = {}  # namespace -> torch.library.Library (kept alive)
        reg.natives = {}  # namespace -> native.Native, or why it cannot serve
        sys.modules[_REGISTRY] = reg
    return reg


def register(api: Any, namespace: str) -> bool:
    """Define (once per process) or re-bind the ops of ``namespace`` to ``api``, and
    attach the package's native launcher as the ops' CUDA kernel where it can serve
    (``Api.launcher`` says which path runs). False when torch is not installed (the
    package then serves other arrays only)."""
    try:
        import torch  # noqa: F401 - the ops are torch's
    except ImportError:
        return False
    reg = _registry()
    first = namespace not in reg.apis
    reg.apis[namespace] = api
    if first:
        reg.libs[namespace] = _define(namespace, reg.apis)
        try:
            reg.natives[namespace] = native.attach(api, reg.apis, namespace, api.package)
        except native.NativeUnavailable as exc:
            reg.natives[namespace] = str(exc)
        except Exception as exc:  # noqa: BLE001 - e.g. a library without a symbol: never
            # break the import for it; the Python path serves and native_reason says why
            reg.natives[namespace] = f"the native launcher failed to start ({exc!r})"
    got = reg.natives[namespace]
    if isinstance(got, str):
        api.native_reason = got
    else:
        if not first:
            got.forget()  # plans of the Api bound before
        api.native = got
        api.native_reason = None
        api.stats._drain = got.drain
    return True


def _define(ns: str, apis: dict[str, Any]) -> Any:
    import torch

    lib = torch.library.Library(ns, "DEF")
    lib.define("linear(Tensor x, Tensor w, Tensor? bias=None) -> Tensor")
    lib.define("matmul(Tensor a, Tensor b) -> Tensor")
    lib.define("linear_residual(Tensor x, Tensor w, Tensor residual, Tensor? bias=None) -> Tensor")
    lib.define("linear_gated(Tensor x, Tensor w, str act, float? eps=None) -> Tensor")
    lib.define("linear_rmsnorm(Tensor x, Tensor w, float eps, Tensor? bias=None) -> Tensor")
    # RoPE and the KV-cache write in the qkv GEMM's epilogue: the caches are mutated
    lib.define(
        "linear_rope_kv(Tensor x, Tensor w, float eps, Tensor? bias, Tensor cos, Tensor sin, "
        "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor positions, int[] heads) -> Tensor"
    )
    # The Python kernels under their own names: the native CUDA kernel hands a call to
    # them when CUDAL2_NATIVE=0 (``native``), so both paths run in one process.
    lib.define("_linear_py(Tensor x, Tensor w, Tensor? bias=None) -> Tensor")
    lib.define("_matmul_py(Tensor a, Tensor b) -> Tensor")
    # ... and every call of a fused op the native kernel does not launch (its inputs,
    # or no gemm_v3 kernel for them): the Python kernel counts the reason, or raises.
    lib.define(
        "_linear_residual_py(Tensor x, Tensor w, Tensor residual, Tensor? bias=None) -> Tensor"
    )
    lib.define("_linear_gated_py(Tensor x, Tensor w, str act, float? eps=None) -> Tensor")
    lib.define("_linear_rmsnorm_py(Tensor x, Tensor w, float eps, Tensor? bias=None) -> Tensor")

    def linear(x: Any, w: Any, bias: Any = None) -> Any:
        return apis[ns].op_linear(x, w, bias)

    def matmul(a: Any, b: Any) -> Any:
        return apis[ns].op_matmul(a, b)

    def linear_residual(x: Any, w: Any, residual: Any, bias: Any = None) -> Any:
        return apis[ns].op_linear_residual(x, w, residual, bias)

    def linear_gated(x: Any, w: Any, act: str, eps: float | None = None) -> Any:
        return apis[ns].op_linear_gated(x, w, act, eps)

    def linear_rmsnorm(x: Any, w: Any, eps: float, bias: Any = None) -> Any:
        return apis[ns].op_linear_rmsnorm(x, w, eps, bias)

    def linear_rope_kv(*args: Any) -> Any:
        return apis[ns].op_linear_rope_kv(*args)

    # One kernel for every backend (CPU, CUDA, sparse, quantized, ...), and for nested
    # tensors, which that alias leaves out: the runtime's own checks send whatever its
    # kernels cannot take to torch, so a sparse weight gets torch's answer (or torch's
    # own exception), never the dispatcher's "could not run ... with SparseCPU".
    for key in ("CompositeExplicitAutograd", "NestedTensorCPU", "NestedTensorCUDA"):
        lib.impl("linear", linear, key)
        lib.impl("matmul", matmul, key)
    # The fused ops: these Python kernels, and (``native``) a CUDA kernel of the native
    # launcher where it serves, which passes gemm_v3's epilogue operands.
    lib.impl("linear_residual", linear_residual, "CompositeExplicitAutograd")
    lib.impl("linear_gated", linear_gated, "CompositeExplicitAutograd")
    lib.impl("linear_rmsnorm", linear_rmsnorm, "CompositeExplicitAutograd")
    lib.impl("linear_rope_kv", linear_rope_kv, "CompositeExplicitAutograd")
    lib.impl("_linear_py", linear, "CompositeExplicitAutograd")
    lib.impl("_matmul_py", matmul, "CompositeExplicitAutograd")
    for name, fn in (
        ("_linear_residual_py", linear_residual),
        ("_linear_gated_py", linear_gated),
        ("_linear_rmsnorm_py", linear_rmsnorm),
    ):
        lib.impl(name, fused.keeping_error(fn), "CompositeExplicitAutograd")

    def linear_fake(x: Any, w: Any, bias: Any = None) -> Any:
        torch._check(x.dim() >= 1 and w.dim() == 2, lambda: "linear: x [..., K], w [N, K]")
        torch._check(x.shape[-1] == w.shape[1], lambda: "linear: x and w differ in K")
        torch._check(x.dtype == w.dtype, lambda: "linear: x and w differ in dtype")
        return x.new_empty((*x.shape[:-1], w.shape[0]))

    def matmul_fake(a: Any, b: Any) -> Any:
        torch._check(a.dim() == 2 and b.dim() == 2, lambda: "matmul: 2-D operands only")
        torch._check(a.shape[1] == b.shape[0], lambda: "matmul: a and b differ in K")
        torch._check(a.dtype == b.dtype, lambda: "matmul: a and b differ in dtype")
        return a.new_empty((a.shape[0], b.shape[1]))

    def linear_residual_fake(x: Any, w: Any, residual: Any, bias: Any = None) -> Any:
        out = linear_fake(x, w, bias)
        torch._check(
            tuple(residual.shape) == tuple(out.shape),
            lambda: "linear_residual: the residual is not the output's shape",
        )
        torch._check(residual.dtype == x.dtype, lambda: "linear_residual: residual dtype")
        return out

    def linear_gated_fake(x: Any, w: Any, act: str, eps: float | None = None) -> Any:
        # The Python kernel's own errors (a wrong act, eps, K, dtype, an odd N), raised
        # while tracing too.
        fused.check_act("linear_gated", act)
        if eps is not None:
            fused.check_eps("linear_gated", eps)
        fused.check_inputs("linear_gated", x, w, None, gated=True)
        return x.new_empty((*x.shape[:-1], w.shape[0] // 2))

    def linear_rmsnorm_fake(x: Any, w: Any, eps: float, bias: Any = None) -> Any:
        fused.check_eps("linear_rmsnorm", eps)
        fused.check_inputs("linear_rmsnorm", x, w, bias)
        return x.new_empty((*x.shape[:-1], w.shape[0]))

    def linear_rope_kv_fake(x, w, eps, bias, cos, sin, k_cache, v_cache, positions, heads):
        # the Python kernel's own errors, raised while tracing too (positions are not read)
        fused.check_eps("linear_rope_kv", eps)
        fused.check_inputs("linear_rope_kv", x, w, bias)
        m = x.numel() // x.shape[-1] if x.shape[-1] else 0
        q, _, d = rope_kv.check_operands(
            "linear_rope_kv", m, w.shape[0], x.dtype, x.device, list(heads), cos, sin,
            k_cache, v_cache, positions, read_positions=False,
        )  # fmt: skip
        return x.new_empty((*x.shape[:-1], q * d))

    torch.library.register_fake(f"{ns}::linear", linear_fake, lib=lib)
    torch.library.register_fake(f"{ns}::linear_rope_kv", linear_rope_kv_fake, lib=lib)
    torch.library.register_fake(f"{ns}::linear_gated", linear_gated_fake, lib=lib)
    torch.library.register_fake(f"{ns}::linear_rmsnorm", linear_rmsnorm_fake, lib=lib)
    torch.library.register_fake(f"{ns}::linear_residual", linear_residual_fake, lib=lib)
    torch.library.register_fake(f"{ns}::matmul", matmul_fake, lib=lib)

    def linear_setup(ctx: Any, inputs: tuple, output: Any) -> None:
        x, w, bias = inputs
        ctx.save_for_backward(x, w)
        ctx.has_bias = bias is not None

    def linear_backward(ctx: Any, grad: Any) -> tuple:
        x, w = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = grad @ w if ctx.needs_input_grad[0] else None
        gw = g2.t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        gb = g2.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb

    def linear_residual_setup(ctx: Any, inputs: tuple, output: Any) -> None:
        x, w, _, bias = inputs
        ctx.save_for_backward(x, w)
        ctx.has_bias = bias is not None

    def linear_residual_backward(ctx: Any, grad: Any) -> tuple:
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad  # x, w, residual, bias
        g2 = grad.reshape(-1, grad.shape[-1])
        gx = grad @ w if need[0] else None
        gw = g2.t() @ x.reshape(-1, x.shape[-1]) if need[1] else None
        gr = grad if need[2] else None
        gb = g2.sum(0) if ctx.has_bias and need[3] else None
        return gx, gw, gr, gb

    def linear_gated_setup(ctx: Any, inputs: tuple, output: Any) -> None:
        x, w, ctx.act, ctx.eps = inputs
        ctx.save_for_backward(x, w)

    def linear_gated_backward(ctx: Any, grad: Any) -> tuple:
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad[:2]
        gx, gw = fused.gated_backward(x, w, ctx.act, ctx.eps, grad, need)
        return gx, gw, None, None

    def linear_rmsnorm_setup(ctx: Any, inputs: tuple, output: Any) -> None:
        x, w, ctx.eps, bias = inputs
        ctx.save_for_backward(x, w)
        ctx.has_bias = bias is not None

    def linear_rmsnorm_backward(ctx: Any, grad: Any) -> tuple:
        x, w = ctx.saved_tensors
        n = ctx.needs_input_grad  # x, w, eps (, bias: left out when it is None)
        need = (n[0], n[1], ctx.has_bias and n[3])
        gx, gw, gb = fused.rmsnorm_backward(x, w, ctx.eps, ctx.has_bias, grad, need)
        return gx, gw, None, gb

    def matmul_setup(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.save_for_backward(*inputs)

    def matmul_backward(ctx: Any, grad: Any) -> tuple:
        a, b = ctx.saved_tensors
        ga = grad @ b.t() if ctx.needs_input_grad[0] else None
        gb = a.t() @ grad if ctx.needs_input_grad[1] else None
        return ga, gb

    torch.library.register_autograd(
        f"{ns}::linear", linear_backward, setup_context=linear_setup, lib=lib
    )
    torch.library.register_autograd(
        f"{ns}::matmul", matmul_backward, setup_context=matmul_setup, lib=lib
    )
    torch.library.register_autograd(
        f"{ns}::linear_residual",
        linear_residual_backward,
        setup_context=linear_residual_setup,
        lib=lib,
    )
    torch.library.register_autograd(
        f"{ns}::linear_gated", linear_gated_backward, setup_context=linear_gated_setup, lib=lib
    )
    torch.library.register_autograd(
        f"{ns}::linear_rmsnorm",
        linear_rmsnorm_backward,
        setup_context=linear_rmsnorm_setup,
        lib=lib,
    )
    return lib


class LinearPatch:
    """The layers ``patch_linear`` routed through the op; ``restore()`` undoes it."""

    def __init__(self, patched: list[tuple[str, Any, type]]):
        self._patched = patched

    @property
    def names(self) -> list[str]:
        """Qualified names of the patched layers."""
        return [name for name, _, _ in self._patched]

    def restore(self) -> None:
        for _, module, cls in self._patched:
            if getattr(type(module), "_cudal2_original", None) is cls:
                module.__class__ = cls
                for attr in ("_cudal2_linear", "_cudal2_eager", "_cudal2_api", "_cudal2_torch"):
                    module.__dict__.pop(attr, None)
        self._patched = []

    def __enter__(self) -> LinearPatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"LinearPatch({len(self._patched)} layers)"


_PATCHED_CLASSES: dict[tuple[type, bool], type] = {}
_UNSEEN = object()
# Reasons that follow from the table and the device alone, for a (device, dtype, M, N, K):
# the same for every call of that size on a layer, so a patched layer remembers them.
TABLE_REASONS = frozenset(
    {"fallback_entry", "no_entry", "align", "fits", "abi", "arch", "gpu", "driver", "table"}
)
_F_linear: Any = None  # torch.nn.functional.linear, set by patch_linear


def _table_reason(module: Any, input: Any, size: int) -> str | None:
    """The table's reason to give inputs of ``size`` elements to torch on ``module``
    (None: the op's kernel serves them, or it depends on the call), remembered on the
    module: the answer ``Api._prepare`` gives once per shape. A fallback entry with an
    eager alternative is not torch's: ``_prepare`` answers its plan, and the op decides
    per call by the stream's capture state (the alternative eagerly, torch under
    capture), so such a size is remembered as the op's (None)."""
    k, n = module.in_features, module.out_features
    reason = None
    dtype = dtype_name(module.weight.dtype)
    if dtype is not None and input.is_cuda and size % k == 0 and size:
        api = module._cudal2_api
        got = api._prepare(_torch, (input.get_device(), dtype, "tn", size // k, n, k))
        if type(got) is str and got in TABLE_REASONS:
            reason = got
    if len(module._cudal2_torch) < 4096:  # many distinct sizes: stop remembering
        module._cudal2_torch[size] = reason
    return reason


_torch: Any = None  # set by patch_linear


def _patched_class(cls: type, native_path: bool) -> type:
    sub = _PATCHED_CLASSES.get((cls, native_path))
    if sub is None and native_path:

        def forward_native(self: Any, input: Any) -> Any:
            # The op for a plain tensor, always: its CUDA kernel is native code, which
            # costs less than any Python path (and autograd, torch.compile and CUDA
            # graphs see the op as before). Anything else: the layer's own forward.
            if type(input) is _torch.Tensor:
                if _torch.is_grad_enabled() or _torch.compiler.is_compiling():
                    return self._cudal2_linear(input, self.weight, self.bias)
                # A size the table gives to torch: torch's own call, as the op would
                # make it, without the op's entry (~5 us). Known per input size.
                size = input.numel()
                reason = self._cudal2_torch.get(size, _UNSEEN)
                if reason is _UNSEEN:
                    reason = _table_reason(self, input, size)
                if reason is not None:
                    self._cudal2_api.stats._fallbacks[reason] += 1
                    return _F_linear(input, self.weight, self.bias)
                # Nothing to record: straight to the CUDA kernel. The op's autograd
                # kernel is Python (torch.library), ~10 us a call even when it only
                # passes the call on, as it would for weights that require grad.
                with _torch._C._AutoDispatchBelowAutograd():
                    return self._cudal2_linear(input, self.weight, self.bias)
            return _patched_class(cls, False).forward(self, input)

        sub = type(
            f"Cudal2{cls.__name__}", (cls,), {"forward": forward_native, "_cudal2_original": cls}
        )
        _PATCHED_CLASSES[(cls, native_path)] = sub
    elif sub is None:

        def forward(self: Any, input: Any) -> Any:
            # Traced (torch.compile) or recording autograd: the op, which the compiler
            # sees and autograd differentiates. Plain inference: the same dispatch
            # without the torch dispatcher's ~25 us per call of a Python-kernel op.
            if _torch.is_grad_enabled() or _torch.compiler.is_compiling():
                if isinstance(input, _torch.Tensor):
                    return self._cudal2_linear(input, self.weight, self.bias)
                # Not a tensor: the op's schema would refuse it with the dispatcher's
                # RuntimeError; the layer's own forward raises what nn.Linear raises.
                return cls.forward(self, input)
            return self._cudal2_eager(input, self.weight, self.bias)

        sub = type(f"Cudal2{cls.__name__}", (cls,), {"forward": forward, "_cudal2_original": cls})
        _PATCHED_CLASSES[(cls, native_path)] = sub
    return sub


def patch_linear(model: Any, api: Any, namespace: str) -> LinearPatch:
    """Route every ``nn.Linear`` of ``model`` (itself included) whose (out_features,
    in_features, dtype) the table covers through ``torch.ops.<namespace>.linear``;
    others are left as they are. Layers already patched are skipped."""
    global _torch, _F_linear
    import torch

    _torch = torch
    _F_linear = torch.nn.functional.linear
    op = getattr(torch.ops, namespace).linear
    # The native path, chosen now (CUDAL2_NATIVE=0 at patch time keeps today's Python
    # forward, so both can be measured in one process: patch, restore, patch again).
    native_path = getattr(api, "native", None) is not None and not native_off()
    if native_path:
        op = op.default  # the overload itself: no overload resolution per call
    patched = []
    for name, module in model.named_modules():
        cls = type(module)
        if not isinstance(module, torch.nn.Linear) or hasattr(cls, "_cudal2_original"):
            continue
        dtype = dtype_name(module.weight.dtype)
        if dtype is None or not api.covers(module.out_features, module.in_features, dtype):
            continue
        module.__class__ = _patched_class(cls, native_path)
        module._cudal2_linear = op
        module._cudal2_eager = api.linear
        module._cudal2_api = api
        module._cudal2_torch = {}  # input size -> the table's reason for torch, or None
        patched.append((name, module, cls))
    return LinearPatch(patched)
