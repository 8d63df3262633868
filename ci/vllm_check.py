"""Check a generated wheel's vLLM plugin against the real vLLM package, on a CPU machine.

Run with the Python of an environment that has vLLM and the wheel installed
(``ci/vllm_check.sh`` makes one). There is no GPU here, so vLLM's platform is
"unspecified": the check makes it report CUDA with compute capability 9.0 (the H100's)
before vLLM loads its plugins, which is what the plugin tests at load time. Kernels do
not run: the op's CPU kernel falls back to torch (counted as ``device`` in the
package's stats), so a call of the op shows as one more ``device`` fallback.

What it checks, each printed as a line and asserted:
1. vLLM's own loader (``vllm.plugins.load_general_plugins``) finds the wheel's entry
   point and runs it; loading again (also forcing vLLM past its once-per-process guard)
   wraps once.
2. ``dispatch_unquantized_gemm`` is the plugin's wrapper in the three modules that use it.
3. vLLM ``ReplicatedLinear`` layers of covered (N, K, dtype) reach the op and match
   ``F.linear``; uncovered shapes, dtypes and a bias layer of an uncovered shape keep
   vLLM's own path.
4. vLLM's LM head (``ParallelLMHead`` + ``LogitsProcessor``) of a covered vocabulary
   reaches the op.
5. ``torch.compile(fullgraph=True, dynamic=True)`` of a covered layer traces through
   the wrapper and calls the op for each token count.
6. On another arch, or without CUDA, the plugin installs nothing.

    python ci/vllm_check.py --package cudal2_kernels_llama_3_1_8b_hf_h100
"""

from __future__ import annotations

import argparse
import importlib
import sys


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--package", required=True, help="the wheel's import name")
    ap.add_argument("--port", type=int, default=29533)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    import vllm
    import vllm.plugins
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    print(f"vllm {vllm.__version__}, torch {torch.__version__}, python {sys.version.split()[0]}")
    print(
        f"platform here: {type(current_platform).__name__}, is_cuda() {current_platform.is_cuda()}"
    )
    # vLLM's layer modules run CUDA-only checks at import when the platform says CUDA
    # (they need vLLM's compiled ops): import them before the platform is forced.
    import vllm.model_executor.layers.linear as linear_mod
    import vllm.model_executor.layers.logits_processor  # noqa: F401
    import vllm.model_executor.layers.utils as utils_mod
    import vllm.model_executor.layers.vocab_parallel_embedding as vocab_mod

    current_platform.is_cuda = lambda: True
    current_platform.get_device_capability = lambda device_id=0: DeviceCapability(9, 0)
    print("forced: is_cuda() True, capability (9, 0)")

    # 1. vLLM's loader, twice, then once more past its guard
    vllm.plugins.load_general_plugins()
    vllm.plugins.load_general_plugins()
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()
    pkg = importlib.import_module(args.package)

    wrapper = utils_mod.dispatch_unquantized_gemm
    chain = getattr(wrapper, "_cudal2_namespaces", ())
    print(f"plugin entry point loaded 3 times: wrapper namespaces {chain}")
    assert chain == (pkg.NAMESPACE,), chain
    # 2. every module that calls it holds the wrapper
    for mod in (utils_mod, linear_mod, vocab_mod):
        assert mod.dispatch_unquantized_gemm is wrapper, mod.__name__
    print("dispatch_unquantized_gemm wrapped in utils, linear, vocab_parallel_embedding")

    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{args.port}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)

    def op_calls() -> int:
        s = pkg.stats
        return sum(s.hits.values()) + sum(s.fallbacks.values())

    covered = sorted(
        {(e.n, e.k) for e in pkg._api.table.entries if e.kind != "fallback"},
        key=lambda nk: nk[0] * nk[1],
    )
    n, k = covered[0]
    torch.manual_seed(0)
    cases = [
        (n, k, torch.float16, False, True),
        (n, k, torch.float16, True, True),  # bias: added after the kernel, inside the op
        (n, k, torch.bfloat16, False, False),  # the wheel is fp16 only
        (n + 8, k, torch.float16, False, False),  # no entry for this N
        (n, k, torch.float32, False, False),
    ]
    # 3. vLLM linear layers
    layers = []
    with set_current_vllm_config(config):
        for nn_, kk, dtype, bias, expect in cases:
            layer = ReplicatedLinear(
                kk, nn_, bias=bias, params_dtype=dtype, disable_tp=True, return_bias=False
            )
            torch.nn.init.normal_(layer.weight, std=kk**-0.5)
            if bias:
                torch.nn.init.normal_(layer.bias)
            x = torch.randn(3, kk, dtype=dtype)
            before = op_calls()
            y = layer(x)
            reached = op_calls() - before
            want = F.linear(x, layer.weight, layer.bias if bias else None)
            print(
                f"ReplicatedLinear N={nn_} K={kk} {str(dtype).split('.')[1]} bias={bias}: "
                f"op calls {reached}, max|y - F.linear| {(y - want).abs().max().item():.3g}"
            )
            assert reached == int(expect) and torch.equal(y, want)
            layers.append(layer)
        # 4. the LM head
        vocab, hidden = max(covered, key=lambda nk: nk[0])
        head = ParallelLMHead(vocab, hidden, params_dtype=torch.float16, disable_tp=True)
        torch.nn.init.normal_(head.weight, std=hidden**-0.5)
        h = torch.randn(2, hidden, dtype=torch.float16)
        before = op_calls()
        logits = LogitsProcessor(vocab)(head, h)
        reached = op_calls() - before
        print(f"LM head vocab {vocab} x {hidden}: logits {tuple(logits.shape)}, op calls {reached}")
        assert reached == 1 and torch.equal(logits, F.linear(h, head.weight))

    # 5. torch.compile through the wrapper, dynamic token count
    compiled = torch.compile(layers[0], fullgraph=True, dynamic=True, backend="aot_eager")
    before = op_calls()
    for m in (5, 17, 33):
        x = torch.randn(m, k, dtype=torch.float16)
        assert torch.equal(compiled(x), F.linear(x, layers[0].weight))
    print(f"torch.compile(fullgraph, dynamic) at M = 5, 17, 33: op calls {op_calls() - before}")
    assert op_calls() - before == 3

    # 6. another arch, or not CUDA: the plugin installs nothing
    install = importlib.import_module(f"{args.package}._runtime.vllm_plugin").install
    current_platform.get_device_capability = lambda device_id=0: DeviceCapability(8, 0)
    on_a100 = install(pkg._api, pkg.NAMESPACE)
    current_platform.is_cuda = lambda: False
    on_cpu = install(pkg._api, pkg.NAMESPACE)
    print(f"install on capability 8.0: {on_a100} modules; platform not CUDA: {on_cpu} modules")
    assert on_a100 == 0 and on_cpu == 0
    print(f"stats: {pkg.stats}")
    print("vLLM plugin check: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
