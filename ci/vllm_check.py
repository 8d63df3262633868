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
7. Every linear layer of vLLM's own models, built by vLLM from a config on this CPU
   (``LlamaForCausalLM`` with Llama-3.1-8B's sizes, ``Qwen2ForCausalLM`` with the same
   sizes and its qkv bias, one decoder layer each; random weights): each layer's call
   at M = 1, 16 and 64 tokens reaches the op exactly when the plugin routes it, gives
   ``F.linear``'s result, and runs the table entry (key, epilogue, PDL flag) the table
   holds for it on the table's GPU (``vllm_plugin.route``, the runtime's own plan of the
   entry): a PDL-flagged launch wherever that entry is a PDL design, a bias layer the
   ``bias`` entry where the table has a kernel of it (else the plain entry, then the
   bias kernel). Under graph capture and eagerly (an eager alternative may run then).

What a CPU machine cannot observe: the kernels running, the programmatic edge a
captured PDL launch makes in vLLM's CUDA graph, the overlap it buys, the GPU and driver
checks the runtime makes at the first call, and pointer alignment (contiguous operands
are assumed). The GPU tests (``tests/packaging/runtime/test_native_fused_gpu.py``,
``test_linear_residual_gpu.py``) run those launches, PDL and plain, eagerly and captured.

    python ci/vllm_check.py --package cudal2_kernels_llama_3_1_8b_hf_h100
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA = ROOT / "manifests" / "configs" / "llama-3.1-8b" / "config.json"
# A Qwen2 decoder of Llama-3.1-8B's sizes (Qwen2's own: qkv bias, head_dim hidden / heads)
QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
TOKENS = (1, 16, 64)


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
    import vllm.compilation.backends  # noqa: F401 - the models' compile wrapper
    import vllm.model_executor.layers.linear as linear_mod
    import vllm.model_executor.layers.logits_processor  # noqa: F401
    import vllm.model_executor.layers.utils as utils_mod
    import vllm.model_executor.layers.vocab_parallel_embedding as vocab_mod
    import vllm.model_executor.models.llama  # noqa: F401 - section 7's models
    import vllm.model_executor.models.qwen2  # noqa: F401

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
    bf16 = pkg._api.covers(n, k, "bf16")  # a wheel of fp16 and bf16, or fp16 only
    cases = [
        (n, k, torch.float16, False, True),
        (n, k, torch.float16, True, True),  # bias: added after the kernel, inside the op
        (n, k, torch.bfloat16, False, bf16),
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
    # 7. every layer of vLLM's own models (the platform forced back to CUDA 9.0)
    current_platform.is_cuda = lambda: True
    current_platform.get_device_capability = lambda device_id=0: DeviceCapability(9, 0)
    # No GPU: vLLM's attention layer asks the platform for a backend at build time;
    # give it the CPU one (the check calls the linear layers, never attention).
    current_platform.get_attn_backend_cls = lambda *a, **k: (
        "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
    )
    route = importlib.import_module(f"{args.package}._runtime.vllm_plugin").route
    llama = json.loads(LLAMA.read_text())
    layers_seen = 0
    for label, cfg, dtype in (
        ("LlamaForCausalLM (Llama-3.1-8B sizes)", llama, torch.float16),
        ("Qwen2ForCausalLM (qkv bias, Llama-3.1-8B sizes)", QWEN2, torch.bfloat16),
    ):
        layers_seen += check_model(pkg, route, label, cfg, dtype, op_calls, args.port)
    print(f"vLLM models: {layers_seen} layer calls checked against the table")
    # The table's fused entries the GEMM hook cannot reach: vLLM's own kernels own the
    # residual add, the RMSNorm and the gated activation (docs/inference.md).
    unreached = sorted(
        {
            (e.epilogue, e.n, e.k)
            for e in pkg._api.table.entries
            if e.kind == "kernel" and e.epilogue not in ("none", "bias")
        }
    )
    print(
        "epilogue entries vLLM's GEMM hook cannot reach: "
        + (", ".join(f"{ep} {n}x{k}" for ep, n, k in unreached) or "none in this table")
    )
    print(f"stats: {pkg.stats}")
    print("vLLM plugin check: all passed")
    return 0


def check_model(pkg, route, label, cfg, dtype, op_calls, port) -> int:
    """Build vLLM's model of ``cfg`` (one decoder layer) and check every linear layer's
    call (module docstring, 7). Returns how many (layer, M) calls it checked."""
    import torch
    import torch.nn.functional as F
    from vllm.config import (
        DeviceConfig,
        LoadConfig,
        ModelConfig,
        VllmConfig,
        set_current_vllm_config,
    )
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.models.llama import LlamaForCausalLM
    from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
    from vllm.utils.torch_utils import set_default_torch_dtype

    api = pkg._api
    table = api.table
    gpu, arch = table.gpu_models[0], table.archs[0]
    name = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
        model_config = ModelConfig(
            model=folder, dtype=dtype, skip_tokenizer_init=True, enforce_eager=True
        )
        config = VllmConfig(
            model_config=model_config,
            device_config=DeviceConfig(device="cpu"),
            load_config=LoadConfig(load_format="dummy"),
        )
        # vLLM's own classes (imported before the platform was forced: their imports
        # check for CUDA extensions when it says CUDA)
        model_cls = {"LlamaForCausalLM": LlamaForCausalLM, "Qwen2ForCausalLM": Qwen2ForCausalLM}[
            cfg["architectures"][0]
        ]
        with set_current_vllm_config(config), set_default_torch_dtype(dtype):
            model = model_cls(vllm_config=config)
    print(f"{label}: vLLM built {type(model).__name__}, {name}, on {gpu} ({arch}) per the table")
    torch.manual_seed(0)
    checked = pdl_calls = pdl_entries = 0
    for qual, layer in model.named_modules():
        head = isinstance(layer, ParallelLMHead)
        if not (isinstance(layer, LinearBase) or head):
            continue
        w = layer.weight
        n, k = w.shape
        bias = getattr(layer, "bias", None) if not head else None
        with torch.no_grad():
            torch.nn.init.normal_(w, std=k**-0.5)
            if bias is not None:
                torch.nn.init.normal_(bias, std=0.1)
        for m in TOKENS[:2] if head else TOKENS:
            x = torch.randn(m, k, dtype=dtype)
            before = op_calls()
            with torch.no_grad(), set_current_vllm_config(config):
                y = LogitsProcessor(n)(layer, x) if head else layer(x)
            y = y[0] if isinstance(y, tuple) else y
            reached = op_calls() - before
            want = F.linear(x, w, bias)
            r = route(api, n, k, dtype, m, bias is not None, gpu, arch, capturing=True)
            eager = route(api, n, k, dtype, m, bias is not None, gpu, arch, capturing=False)
            # What the table holds for this call, read apart from `route`
            plain = table.lookup(gpu, arch, name, "tn", m, n, k)
            fused = (
                table.lookup(gpu, arch, name, "tn", m, n, k, "bias") if bias is not None else None
            )
            entry = fused if fused is not None and fused.kind == "kernel" else plain
            pdl = entry is not None and entry.kind == "kernel" and entry.launch.get("pdl") is True
            print(
                f"  {qual} {type(layer).__name__} {n}x{k} bias={bias is not None} M={m}: "
                f"op calls {reached}, path {r.path}, entry {r.entry} ({r.kind}, epilogue "
                f"{r.epilogue}), runs {r.runs}, PDL {r.pdl}, bias {r.bias}"
                + ("" if eager == r else f"; eagerly {eager.runs}, PDL {eager.pdl}")
            )
            assert reached == int(r.path == "cudal2"), (reached, r)
            assert torch.equal(y, want), qual
            if r.path == "cudal2":
                assert entry is not None and r.entry == str(entry.key), (r, entry)
                assert r.pdl == pdl, (r, entry.launch)
                if bias is not None:
                    want_bias = "epilogue" if entry is fused else "bias kernel"
                    assert (r.epilogue == "bias") == (entry is fused), r
                    assert r.bias == want_bias or r.runs.startswith("torch"), r
            else:
                assert plain is None or plain.kind == "fallback", (qual, plain)
            checked += 1
            pdl_calls += r.pdl
            pdl_entries += pdl
    print(
        f"{label}: {checked} calls, {pdl_calls} PDL-flagged launches "
        f"(the table's entry is a PDL design for {pdl_entries} of them)"
    )
    del model
    return checked


if __name__ == "__main__":
    sys.exit(main())
