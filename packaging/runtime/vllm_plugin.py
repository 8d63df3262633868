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
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

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
            dtype = dtype_name(weight.dtype)
            if (
                dtype is not None
                and x.dtype == weight.dtype
                and weight.dim() == 2
                and api.covers(weight.shape[0], weight.shape[1], dtype)
            ):
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
