"""bench/experiments/llama_kv_e2e.py (issue 21's end to end with a KV cache) without a
GPU: ``--dry-run`` runs every part's code path on a tiny fp32 Llama / Qwen2 on the CPU
through a generated package (the recorded table: every fused op falls back), the
"graph" part traced whole by ``torch.compile(backend="aot_eager", fullgraph=True)``;
the JSON it writes, merged part by part; and the argument errors. The figures of a
dry run are not measurements."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench/experiments/llama_kv_e2e.py"


@pytest.fixture(scope="module")
def e2e():
    spec = importlib.util.spec_from_file_location("llama_kv_e2e", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["llama_kv_e2e"] = mod
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules["llama_kv_e2e"]


@pytest.fixture
def package(tmp_path, monkeypatch, recorded_table, recorded_cubins, write_package):
    """The recorded table as an imported generated package (forgotten afterwards)."""
    name = write_package(tmp_path, recorded_table, recorded_cubins)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module(name)
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]


def test_dry_run_every_part(e2e, package, tmp_path):
    out = tmp_path / "kv.json"
    base = ["--dry-run", "--package", package.__name__, "--out", str(out)]
    base += ["--batches", "1,2", "--steps", "2", "--reps", "2"]
    assert e2e.main([*base, "--part", "check", "--part", "eager"]) == 0
    first = json.loads(out.read_text())
    assert sorted(first["llama"]) == ["check", "eager"]
    assert e2e.main([*base, "--part", "prefill", "--part", "graph", "--part", "qwen2"]) == 0
    got = json.loads(out.read_text())
    assert sorted(got["llama"]) == ["check", "eager", "graph", "prefill"]  # merged
    env = got["env"]
    assert env["dry_run"] and env["gpu"] == "cpu (dry run)" and env["transformers"]
    check = got["llama"]["check"]
    c = check["correctness"]
    assert c["ok"] and c["err_patched_vs_fp32"] < 1e-3  # fp32 vs fp32: rounding order only
    # fp32: the packed qkv and gate_up of 2 layers, the LM head with the final norm folded
    packed = 2 * 4 * (128 * 64 + 192 * 64) + 4 * 97 * 64
    assert check["memory"]["patch_memory"] == {"cpu": packed}
    assert check["report"]["layers"] == 2
    # the path per M: the dry run asks for the fused forward (uncovered="fused")
    paths = check["report"]["paths"]
    assert {"1", "2", "16", "32"} <= set(paths)  # batches, the check's, the prefill's
    assert paths["32"] == {"layers": {"fused_fallback": 2}, "lm_head": "fused_fallback"}
    assert check["report"]["lm_head"]["epilogue"] == "rmsnorm"
    assert set(check["report"]["per_gemm"]) == {"qkv", "o_proj", "gate_up", "down"}
    assert check["one_decode_step"]["fallbacks"]  # the CPU: every op falls back
    for part in ("eager", "graph"):
        rows = got["llama"][part]["batches"]
        assert sorted(rows) == ["1", "2"]
        assert rows["2"]["tokens_per_s"]["patched"] > 0 and rows["2"]["speedup"] > 0
    assert got["llama"]["eager"]["batches"]["2"]["patched_step"]["fallbacks"]
    graph = got["llama"]["graph"]["batches"]["1"]
    assert graph["max_diff_compiled_vs_eager_patched"] < 1e-4
    prefill = got["llama"]["prefill"]
    assert prefill["tokens"] == 32 and prefill["fallbacks"]  # the CPU: every call torch's
    assert prefill["max_diff_patched_vs_unpatched"] <= 1e-3 * prefill["max_abs_logit"]
    q = got["qwen2"]
    assert q["correctness"]["ok"] and q["correctness_b1"]["ok"]
    assert q["correctness_b1"]["prompt"][0] == 1
    assert q["report"]["per_gemm"]["qkv"]["epilogue"] == "rmsnorm_bias"
    assert sorted(q["graph"]["batches"]) == sorted(q["eager"]["batches"]) == ["1"]


def test_a_failed_qwen2_check_at_batch_1_fails_the_run(e2e, package, tmp_path, monkeypatch):
    """``qwen2``'s batch-1 logits check counts as the others do: wrong, the run exits 1."""
    real = e2e.correctness

    def wrong_at_1(s, model, patched, batch=None):
        return {**real(s, model, patched, batch), "ok": batch != 1}

    monkeypatch.setattr(e2e, "correctness", wrong_at_1)
    out = tmp_path / "kv.json"
    argv = ["--dry-run", "--package", package.__name__, "--out", str(out), "--part", "qwen2"]
    assert e2e.main([*argv, "--batches", "1", "--steps", "2", "--reps", "2"]) == 1
    got = json.loads(out.read_text())["qwen2"]
    assert got["correctness"]["ok"] and not got["correctness_b1"]["ok"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batches", "0"], "--batches must be positive"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--part", "decode"], "invalid choice: 'decode'"),
        (["--prefill", "-1"], "--prefill must be at least 1"),
    ],
)
def test_bad_arguments_exit_2(e2e, argv, message, capsys):
    with pytest.raises(SystemExit) as got:
        e2e.parse(["--package", "x", "--out", "y", *argv])
    assert got.value.code == 2
    assert message in capsys.readouterr().err


def test_the_e2e_manifest_covers_the_run(e2e):
    """bench/manifests/llama-e2e-h100.toml has a target for every GEMM the run's patched
    models call at the run's default Ms (decode batches, the prefill, its LM head at 1
    row), each with the epilogue patch_model looks up (the runtime's family table)."""
    from cudal2.manifest import load_manifest
    from cudal2.packaging.runtime.families import FAMILIES, layer_gemms

    root = Path(__file__).resolve().parents[2]
    m = load_manifest(root / "bench/manifests/llama-e2e-h100.toml")
    have = {(t.m, t.n, t.k, t.epilogue) for t in m.targets if t.dtype == "fp16"}
    args = e2e.parse(["--package", "x", "--out", "y"])
    llama = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096)}
    llama |= {"down": (4096, 14336), "lm_head": (128256, 4096)}
    qwen2 = {"qkv": (4608, 3584), "o": (3584, 3584), "gate_up": (37888, 3584)}
    qwen2 |= {"down": (3584, 18944), "lm_head": (152064, 3584)}
    want = set()
    for family, shapes, ms in (
        ("llama", llama, [*args.batches, args.prefill]),
        ("qwen2", qwen2, [1]),
    ):
        gemms = {g.proj: g.epilogue for g in layer_gemms(FAMILIES[family], "silu")}
        for mm in ms:
            for proj, (n, k) in shapes.items():
                epilogue = gemms.get(proj, "rmsnorm")  # the head: the final norm folded
                want |= {(mm, n, k, epilogue), (mm, n, k, "none")}
                if proj == "lm_head":
                    want.add((1, n, k, epilogue))  # the prefill's head: logits_to_keep=1
    assert want <= have, sorted(want - have)
    assert len(m.targets) == 50


def test_the_bound_part(e2e, package, tmp_path):
    """``bound``: a third model timed beside the two, the patched one without RoPE and
    without the cache write. Its cache is left as it was (the patched model's is
    written), its logits differ from the patched model's (RoPE is gone), and the part's
    rows carry its paired speedup."""
    import torch

    out = tmp_path / "kv.json"
    argv = ["--dry-run", "--package", package.__name__, "--out", str(out)]
    argv += ["--batches", "1", "--steps", "2", "--reps", "2", "--part", "bound"]
    assert e2e.main(argv) == 0
    row = json.loads(out.read_text())["llama"]["bound"]["batches"]["1"]
    assert set(row["tokens_per_s"]) == {"unpatched", "patched", "bound"}
    assert row["speedup_bound"] > 0 and len(row["paired_p20_p80_bound"]) == 2

    s = e2e.Setup(e2e.parse(argv))
    model = e2e.build(s, s.config())
    patched, patch = e2e.patched_copy(s, model)
    twin, twin_patch = e2e.bound_twin(s, model)
    ids = torch.ones((1, 1), dtype=torch.long)
    got = {}
    with torch.no_grad():
        for name, m, cache in (
            ("patched", patched, e2e.static_cache(s, patched, 1, s.context + 2, s.context)),
            ("bound", twin, e2e.unwritten(e2e.static_cache(s, twin, 1, s.context + 2, s.context))),
        ):
            before = [layer.keys.clone() for layer in cache.layers]
            got[name] = e2e.step_fn(m, cache)(ids)
            kept = all(
                torch.equal(b, layer.keys) for b, layer in zip(before, cache.layers, strict=True)
            )
            assert kept == (name == "bound"), name
    assert not torch.allclose(got["patched"], got["bound"])
    twin_patch.restore()
    patch.restore()


def test_dry_run_with_rope_kv(e2e, package, tmp_path, monkeypatch):
    """``--rope-kv``: the patched models run ``linear_rope_kv`` into the static cache (the
    CPU: its fallback) eagerly and traced whole by torch.compile (the op's fake impl,
    its caches mutated); the logits still pass the check."""
    calls = []
    real = package._api.op_linear_rope_kv
    monkeypatch.setattr(package._api, "op_linear_rope_kv", lambda *a: calls.append(1) or real(*a))
    eager_calls = []
    real_eager = package._api.linear_rope_kv
    monkeypatch.setattr(
        package._api, "linear_rope_kv", lambda *a: eager_calls.append(1) or real_eager(*a)
    )
    out = tmp_path / "kv-rope.json"
    base = ["--dry-run", "--package", package.__name__, "--out", str(out), "--rope-kv"]
    base += ["--batches", "1", "--steps", "2", "--reps", "2"]
    assert e2e.main([*base, "--part", "check", "--part", "graph", "--part", "qwen2"]) == 0
    got = json.loads(out.read_text())
    assert got["env"]["rope_kv"] is True
    assert got["llama"]["check"]["correctness"]["ok"] and got["qwen2"]["correctness"]["ok"]
    graph = got["llama"]["graph"]["batches"]["1"]
    assert graph["max_diff_compiled_vs_eager_patched"] < 1e-4
    assert eager_calls  # the eager decode steps
    assert calls  # the traced graph's op (its real kernel runs under aot_eager)


def test_dry_run_with_grouped_decode(e2e, package, tmp_path, monkeypatch):
    """``--grouped-decode`` (with ``--rope-kv``): the patched models' decode steps run the
    grouped form (``math`` unless ``--grouped-variant`` says, as ``patch_model``'s
    default), eagerly and traced whole by torch.compile; the logits still pass."""
    import importlib

    runtime = importlib.import_module(package.__name__ + "._runtime.models")
    calls = []
    for name in ("math", "sdpa"):
        real = getattr(runtime, f"_grouped_decode_{name}")
        monkeypatch.setattr(
            runtime, f"_grouped_decode_{name}", lambda *a, n=name, f=real: calls.append(n) or f(*a)
        )
    out = tmp_path / "kv-grouped.json"
    base = ["--dry-run", "--package", package.__name__, "--out", str(out), "--rope-kv"]
    base += ["--grouped-decode", "--batches", "8", "--steps", "2", "--reps", "2"]
    assert e2e.main([*base, "--part", "check", "--part", "graph"]) == 0
    got = json.loads(out.read_text())
    assert got["env"]["grouped_decode"] is True and got["env"]["grouped_variant"] == "math"
    assert got["llama"]["check"]["correctness"]["ok"]
    assert got["llama"]["graph"]["batches"]["8"]["max_diff_compiled_vs_eager_patched"] < 1e-4
    assert calls and set(calls) == {"math"}


@pytest.mark.parametrize("variant", ["sdpa", "math"])
def test_the_grouped_part(e2e, package, tmp_path, monkeypatch, variant):
    """``grouped``: a third model, the patched one with ``grouped_decode="sdpa"`` (or
    ``"math"``, the default), timed beside the two under torch.compile; its decode steps
    (and only its) run the grouped call (SDPA from 16 (sequence, KV head) pairs: batch 8, not 1; the
    math form at both); its logits are checked against fp32; the rows carry its paired
    speedup."""
    import importlib

    runtime = importlib.import_module(package.__name__ + "._runtime.models")
    calls = []
    name = f"_grouped_decode_{variant}"
    real = getattr(runtime, name)
    monkeypatch.setattr(runtime, name, lambda t, q, *a: calls.append(q.shape[0]) or real(t, q, *a))
    out = tmp_path / "kv.json"
    argv = ["--dry-run", "--package", package.__name__, "--out", str(out), "--rope-kv"]
    argv += ["--grouped-variant", variant]
    argv += ["--batches", "1,8", "--steps", "2", "--reps", "2", "--part", "grouped"]
    assert e2e.main(argv) == 0
    got = json.loads(out.read_text())
    assert got["env"]["grouped_decode"] is False  # the patched model is not grouped
    part = got["llama"]["grouped"]
    assert part["correctness_grouped"]["ok"]
    assert part["correctness_grouped"]["err_patched_vs_fp32"] < 1e-3
    for batch in ("1", "8"):
        row = part["batches"][batch]
        assert set(row["tokens_per_s"]) == {"unpatched", "patched", "grouped"}
        assert row["speedup_grouped"] > 0 and len(row["paired_p20_p80_grouped"]) == 2
        assert row["max_diff_compiled_vs_eager_grouped"] < 1e-4
    # batch 8's decode steps (SDPA at 1: 2 pairs, below the minimum), the check's 8 rows
    assert set(calls) == ({8} if variant == "sdpa" else {1, 8})
    assert got["env"]["grouped_variant"] == variant
    # a grouped twin whose logits are wrong fails the run (exit 1)
    monkeypatch.setattr(runtime, name, lambda *a: 2 * real(*a))
    assert e2e.main([*argv[:-1], "grouped", "--batches", "8"]) == 1
