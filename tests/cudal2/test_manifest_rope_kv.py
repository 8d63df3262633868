"""The rope_kv epilogues in manifests: a ``[[targets]]`` group's ``epilogue`` and
``heads`` (every shape of the group gets them), a ``[[model]]``'s qkv projection with
its head split read from the config (per tensor-parallel rank); bad values are rows of a
table, each naming the key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudal2.manifest import ManifestError, load_manifest

ROOT = Path(__file__).parents[2]
CONFIGS = Path(__file__).parent / "configs"
PACKAGE = '[package]\nname = "t"\nversion = "0.1.0"\n'


def _load(tmp_path: Path, text: str):
    path = tmp_path / "manifest.toml"
    path.write_text(text)
    return load_manifest(path)


def _targets(body: str) -> str:
    return f"{PACKAGE}[[targets]]\nshapes = [[1, 6144, 4096], [16, 6144, 4096]]\n{body}"


def test_the_sweep_manifest_expands_to_rope_kv_targets_with_heads():
    m = load_manifest(ROOT / "bench" / "manifests" / "sweep-rope-kv-h100.toml")
    got = {(t.m, t.n, t.k, t.epilogue, t.heads) for t in m.targets}
    assert got == {
        (mm, 6144, 4096, e, h)
        for mm in (1, 16)
        for e, h in (("rmsnorm_rope_kv", (32, 8, 128)), ("rmsnorm", ()))
    }


def test_a_targets_group_takes_an_epilogue_and_heads(tmp_path):
    m = _load(tmp_path, _targets("epilogue = 'rmsnorm_bias_rope_kv'\nheads = [32, 8, 128]\n"))
    assert {t.epilogue for t in m.targets} == {"rmsnorm_bias_rope_kv"}
    assert {t.heads for t in m.targets} == {(32, 8, 128)} and {t.m for t in m.targets} == {1, 16}


@pytest.mark.parametrize("tp", [1, 2, 16])
def test_a_models_qkv_gets_the_configs_head_split(tmp_path, tp):
    text = (
        f"{PACKAGE}[[model]]\nconfig = '{CONFIGS / 'llama-3.1-70b'}'\ntokens = [1]\ntp = {tp}\n"
        "epilogues = { qkv = ['rmsnorm_rope_kv'] }\n"
    )
    (t,) = [t for t in _load(tmp_path, text).targets if t.epilogue == "rmsnorm_rope_kv"]
    # Llama-3.1-70B: 64 query heads, 8 KV heads (replicated past tp 8), head_dim 128
    assert t.heads == (64 // tp, max(1, 8 // tp), 128)
    assert t.n == (t.heads[0] + 2 * t.heads[1]) * 128


HOSTILE = [
    ("heads without a rope epilogue", "epilogue = 'rmsnorm'\nheads = [32, 8, 128]\n",
     "targets[0].heads", "only for the rope_kv"),
    ("a rope epilogue without heads", "epilogue = 'rmsnorm_rope_kv'\n", "targets[0].heads",
     "needs heads"),
    ("heads not splitting N", "epilogue = 'rmsnorm_rope_kv'\nheads = [32, 4, 128]\n",
     "targets[0].heads", "N = 6144 is not"),
    ("heads of two", "epilogue = 'rmsnorm_rope_kv'\nheads = [32, 8]\n", "targets[0].heads",
     "must be \\[q_heads, kv_heads, head_dim\\]"),
    ("heads a string", "epilogue = 'rmsnorm_rope_kv'\nheads = '32/8/128'\n",
     "targets[0].heads", "must be \\[q_heads"),
    ("a zero head", "epilogue = 'rmsnorm_rope_kv'\nheads = [0, 8, 128]\n",
     "targets[0].heads[0]", "must be positive"),
    ("an odd head_dim", "epilogue = 'rmsnorm_rope_kv'\nheads = [46, 1, 127]\n",
     "targets[0].heads", "N = 6144 is not|must be even"),
    ("an unknown epilogue", "epilogue = 'rope'\n", "targets[0].epilogue", "unsupported"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "body", "key", "needle"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_bad_values_name_the_key(tmp_path, case, body, key, needle):
    with pytest.raises(ManifestError, match=needle) as e:
        _load(tmp_path, _targets(body))
    assert e.value.key_path == key, e.value


def test_a_rope_epilogue_on_another_projection_is_refused(tmp_path):
    text = (
        f"{PACKAGE}[[model]]\nconfig = '{CONFIGS / 'llama-3.1-70b'}'\ntokens = [1]\ntp = 8\n"
        "epilogues = { o = ['rmsnorm_rope_kv'] }\n"
    )
    with pytest.raises(ManifestError, match="the fused qkv projection's alone") as e:
        _load(tmp_path, text)
    assert e.value.key_path == "model[0].epilogues.o[0]"


def test_the_e2e_rope_manifest_asks_the_qkv_rope_targets_beside_the_e2e_ones():
    m = load_manifest(ROOT / "bench" / "manifests" / "llama-e2e-rope-h100.toml")
    rope = {(t.m, t.n, t.k, t.heads) for t in m.targets if t.epilogue == "rmsnorm_rope_kv"}
    assert rope == {(mm, 6144, 4096, (32, 8, 128)) for mm in (1, 16)}
    e2e = load_manifest(ROOT / "bench" / "manifests" / "llama-e2e-h100.toml")
    # every other target is one the e2e wheel's manifest asks for (Llama at M 1 and 16)
    others = {t for t in m.targets if t.epilogue != "rmsnorm_rope_kv"}
    assert others <= set(e2e.targets) and len(others) == 20


def test_the_grouped_decode_manifest_is_the_rope_one_at_batch_64_too():
    """bench/manifests/llama-e2e-grouped-h100.toml (ci/gpu_e2e_grouped.sh): the rope_kv
    e2e manifest's targets at M 1 and 16, and the same GEMMs at 64."""
    m = load_manifest(ROOT / "bench" / "manifests" / "llama-e2e-grouped-h100.toml")
    rope = load_manifest(ROOT / "bench" / "manifests" / "llama-e2e-rope-h100.toml")
    assert set(rope.targets) < set(m.targets)
    extra = {t for t in m.targets if t not in set(rope.targets)}
    assert {t.m for t in extra} == {64}
    assert {(t.n, t.k, t.epilogue) for t in extra} == {
        (t.n, t.k, t.epilogue) for t in rope.targets if t.m == 16
    }
