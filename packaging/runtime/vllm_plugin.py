"""vLLM general plugin: vLLM's unquantized GEMMs through the package's torch op.

vLLM (0.32) computes every unquantized linear layer and the LM head through the
callable that ``vllm.model_executor.layers.utils.dispatch_unquantized_gemm()``
returns: ``gemm(layer, x, weight, bias=None)``. Linear layers pick it once, when they
are built (``UnquantizedLinearMethod.__init__``); the LM head's
``UnquantizedEmbeddingMethod.apply`` asks for it per call. ``linear.py`` and
``vocab_parallel_embedding.py`` import the function by name, so ``install`` replaces it
in those modules and in ``utils``. General plugins run in every vLLM process before
the model is built, so every layer sees the wrapper.

The wrapper keeps vLLM's own choice (``dispatch_unquantized_gemm`` is still called,
e.g. for flashinfer or ROCm) and, when the platform is CUDA and its compute capability
is one the wheel was built for, returns a ``gemm`` that sends weights whose (N, K,
dtype) the table covers (x of the weight's dtype) to ``torch.ops.<namespace>.linear``
and everything else to vLLM's callable. The decision uses only the weight's shape and
dtype, which are static under vLLM's torch.compile (the token count is dynamic); the
op dispatches by M inside. Installing twice (several plugin loads, several processes
importing the package) wraps once per namespace.

What the op's call runs (``route`` says it for a weight, a bias or none, and M, on a
GPU model of the table, without a GPU):

- **PDL.** The op launches the table's entry as the table says: an entry whose launch
  recipe has ``"pdl": true`` goes out with programmatic stream serialization (the
  native launcher's ``PlanDesc.pdl``, else ``driver.launch_gemm``), eagerly and under
  the CUDA-graph capture vLLM makes (a captured launch with the attribute becomes a
  programmatic edge of the graph). Nothing here chooses it: the entry's design does.
- **The bias epilogue.** A layer with a bias (Qwen2's qkv_proj) whose (N, K, dtype)
  the table serves with a ``bias`` entry (a gemm_v3 kernel: A W^T + bias summed in
  fp32, rounded once) runs that entry, natively or in Python; otherwise the plain entry
  and then the bias kernel (the Python path: ``add_``). A layer with a bias is routed
  when the table has either.
- **Not reachable from here**: the residual add, the RMSNorm and the gated activation.
  vLLM applies them in its own fused kernels around the GEMMs (``fused_add_rms_norm``
  adds the residual and normalises in one kernel; ``SiluAndMul`` gates), outside
  ``gemm(layer, x, weight, bias)``; ``docs/inference.md`` says what reaching them takes.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, NamedTuple

from . import driver
from .api import _arch_digits, dtype_name

MODULES = (
    "vllm.model_executor.layers.utils",
    "vllm.model_executor.layers.linear",
    "vllm.model_executor.layers.vocab_parallel_embedding",
)
FUNCTION = "dispatch_unquantized_gemm"


def _capability_ok(api: Any) -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return False
    cap = current_platform.get_device_capability()
    if cap is None:
        return False
    return any(_arch_digits(a) == f"{cap[0]}{cap[1]}" for a in api.table.archs)


def install(api: Any, namespace: str) -> int:
    """Route vLLM's covered unquantized GEMMs to ``torch.ops.<namespace>.linear``.
    Returns how many modules now hold the wrapper (0: not CUDA, another arch, or an
    unknown vLLM layout: vLLM keeps its own path, with a warning in the last case)."""
    import torch

    if not _capability_ok(api):
        return 0
    try:
        utils = importlib.import_module(MODULES[0])
        current = getattr(utils, FUNCTION)
    except (ImportError, AttributeError) as exc:
        warnings.warn(
            f"{api.package}: this vLLM has no {MODULES[0]}.{FUNCTION} ({exc}); "
            "its linear layers keep vLLM's own GEMM",
            RuntimeWarning,
            stacklevel=2,
        )
        return 0
    if namespace in getattr(current, "_cudal2_namespaces", ()):
        wrapper = current  # installed already
    else:
        wrapper = _wrap(current, api, getattr(torch.ops, namespace).linear, namespace)
    done = 0
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        held = getattr(module, FUNCTION, None)
        if held is current or held is wrapper:
            setattr(module, FUNCTION, wrapper)
            done += 1
    return done


def _wrap(original: Any, api: Any, op: Any, namespace: str) -> Any:
    def dispatch_unquantized_gemm(*args: Any, **kwargs: Any) -> Any:
        inner = original(*args, **kwargs)

        def gemm(layer: Any, x: Any, weight: Any, bias: Any = None) -> Any:
            if x.dtype == weight.dtype and routed(api, weight, bias is not None):
                return op(x, weight, bias)
            return inner(layer, x, weight, bias)

        gemm._cudal2_inner = inner
        return gemm

    dispatch_unquantized_gemm._cudal2_namespaces = (
        *getattr(original, "_cudal2_namespaces", ()),
        namespace,
    )
    dispatch_unquantized_gemm.__wrapped__ = original
    return dispatch_unquantized_gemm


def routed(api: Any, weight: Any, bias: bool) -> bool:
    """Whether the wrapper sends a call on ``weight`` (with a bias or not) to the op: the
    table has a plain entry for its (N, K, dtype), or, with a bias, a ``bias`` kernel
    entry. Static per layer (shape and dtype only), so vLLM's compiled graph keeps it."""
    dtype = dtype_name(weight.dtype)
    if dtype is None or weight.dim() != 2:
        return False
    n, k = weight.shape
    return api.covers(n, k, dtype) or (bias and api._fuses(weight.dtype, weight, "bias"))


class Route(NamedTuple):
    """What the wrapper's ``gemm`` runs for one call, as the table answers it on a GPU
    model (``route``): the launch the runtime would make, without making it."""

    path: str  # "cudal2": torch.ops.<namespace>.linear; "vllm": vLLM's own GEMM
    entry: str | None  # the table entry the op's lookup finds (its key), None: none
    kind: str | None  # that entry's kind: kernel, cublaslt or fallback
    epilogue: str  # the entry's epilogue: "bias" where the bias entry serves, else "none"
    pdl: bool  # the launch asks programmatic stream serialization (recipe "pdl": true)
    runs: str  # what runs: the kernel's name, "cublaslt", or "torch (<reason>)"
    bias: str | None  # "epilogue" (in the kernel), "bias kernel" (after it), "torch", None


def route(
    api: Any,
    n: int,
    k: int,
    dtype: Any,
    m: int,
    bias: bool = False,
    gpu: str | None = None,
    arch: str | None = None,
    capturing: bool = True,
) -> Route:
    """The launch the plugin's ``gemm`` makes for x [m, k] and a weight [n, k] of torch
    ``dtype`` (with a bias or not) on ``gpu`` / ``arch`` (default: the table's first;
    stand-in models resolve as at run time), under CUDA-graph capture or eagerly (an
    entry's eager alternative then runs in its place). The op's own decisions in their
    order (``Api._linear``, the native ``run``): the ``bias`` entry where a bias and a
    kernel of that epilogue serve this M, else the plain entry, its alignment and fit
    rules, then the bias added after it. What it cannot see: a device or driver the
    table refuses, pointers and strides (contiguous operands assumed), a launch that
    fails; ``path`` "vllm" where the wrapper keeps vLLM's GEMM."""
    import torch

    weight = torch.empty((n, k), dtype=dtype, device="meta")
    name = dtype_name(dtype)
    if not routed(api, weight, bias):
        return Route("vllm", None, None, "none", False, "vLLM's GEMM", "vLLM" if bias else None)
    table = api.table
    gpu = gpu or table.gpu_models[0]
    arch = arch or table.archs[0]
    if bias:
        e = table.lookup(gpu, arch, name, "tn", m, n, k, "bias")
        if e is not None and e.kind == "kernel":
            plan = api._plan(e)
            if plan.reason is None and _fits(plan, m, n, k):
                return _launch(plan, e, "epilogue")
    e = table.lookup(gpu, arch, name, "tn", m, n, k)
    after = "bias kernel" if bias else None
    by_torch = "torch" if bias else None  # torch's addmm adds it
    if e is None:
        return Route("cudal2", None, None, "none", False, "torch (no_entry)", by_torch)
    plan = api._plan(e)
    alt = plan.eager
    if alt is not None and not capturing and alt.reason is None and _fits(alt, m, n, k):
        return _launch(alt, e, after)
    if plan.reason is not None or not _fits(plan, m, n, k):
        why = plan.reason or "align/fits"
        return Route("cudal2", str(e.key), e.kind, "none", False, f"torch ({why})", by_torch)
    return _launch(plan, e, after)


def _fits(plan: Any, m: int, n: int, k: int) -> bool:
    """``Api._ready_on``'s shape rules, without loading anything."""
    mnk = (m, n, k)
    if any(mnk[dim] % multiple for dim, multiple in plan.align):
        return False
    return plan.lt is not None or driver.gemm_fits(plan.recipe, m, n, k)


def _launch(plan: Any, entry: Any, bias: str | None) -> Route:
    """The Route of launching ``plan`` (an entry's, or its eager alternative's)."""
    runs = "cublaslt" if plan.lt is not None else plan.kernel.symbol
    return Route(
        "cudal2",
        str(entry.key),
        entry.kind,
        entry.epilogue,
        plan.lt is None and plan.recipe.get("pdl") is True,  # as driver.launch_gemm reads it
        runs,
        bias,
    )
