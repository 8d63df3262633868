"""The RoPE + KV-cache epilogues' records: appended (every earlier epilogue keeps its
index, so every design's knob value), row-scaled, and the target's ``heads`` field: left
out of the JSON when unset (every other key unchanged), required for and only for the
ROPE_KV epilogues, validated (a table of hostile values), read back by the database
schema naming the key path."""

from __future__ import annotations

import json

import pytest

from cudal2.records import (
    EPILOGUES,
    ROPE_KV,
    ROW_SCALED,
    Target,
    canonical_json,
    out_columns,
    sha256_hex,
)

# records.EPILOGUES before the rope_kv epilogues: their indices are design knob values
BEFORE = (
    "none", "bias", "residual", "bias_residual", "silu", "gelu_tanh", "rmsnorm",
    "rmsnorm_bias", "rmsnorm_silu", "rmsnorm_gelu_tanh",
)  # fmt: skip
LLAMA_8B = (32, 8, 128)  # q_heads, kv_heads, head_dim: N = 6144


def test_the_rope_kv_epilogues_are_appended_and_row_scaled():
    assert EPILOGUES[: len(BEFORE)] == BEFORE
    assert EPILOGUES[len(BEFORE) :] == ("rmsnorm_rope_kv", "rmsnorm_bias_rope_kv")
    assert ROPE_KV <= ROW_SCALED


def _target(**change) -> Target:
    d = dict(arch="sm_90a", dtype="fp16", layout="tn", m=1, n=6144, k=4096)
    d.update(epilogue="rmsnorm_rope_kv", heads=LLAMA_8B)
    d.update(change)
    return Target(**d)


def test_heads_are_in_the_json_only_when_set():
    t = _target()
    d = t.as_json()
    assert d["heads"] == [32, 8, 128] and d["epilogue"] == "rmsnorm_rope_kv"
    assert Target.from_json(json.loads(json.dumps(d))) == t
    assert t.key == sha256_hex(canonical_json(d))
    plain = Target("sm_90a", "fp16", "tn", 1, 6144, 4096, epilogue="rmsnorm")
    assert "heads" not in plain.as_json()
    assert t.plain == Target("sm_90a", "fp16", "tn", 1, 6144, 4096)
    assert t.key != _target(heads=(40, 4, 128)).key  # another split: another target
    assert "heads 32/8/128" in t.label


def test_the_output_is_q_only_and_the_cache_writes_count_in_the_byte_floor():
    t = _target(m=16)
    assert t.out_n == 32 * 128 == out_columns(t.epilogue, t.n, t.heads)
    rmsnorm = Target("sm_90a", "fp16", "tn", 16, 6144, 4096, epilogue="rmsnorm")
    # q written instead of q, k, v; cos, sin and k, v rows (to the cache) added
    assert t.min_bytes == rmsnorm.min_bytes - 2 * 16 * 2048 + 2 * (2 * 16 * 128 + 2 * 16 * 1024)


HOSTILE = [
    ("rope_kv without heads", dict(heads=()), "needs heads = \\[q_heads, kv_heads, head_dim\\]"),
    ("heads on rmsnorm", dict(epilogue="rmsnorm"), "heads \\[32, 8, 128\\] is only for"),
    ("heads on a plain target", dict(epilogue="none"), "is only for the rope_kv"),
    ("heads not matching N", dict(heads=(32, 4, 128)), "N = 6144 is not .* = 5120"),
    ("odd head_dim", dict(n=6 * 3, heads=(2, 2, 3)), "head_dim 3 must be even"),
    ("two numbers", dict(heads=(32, 8)), "three positive integers"),
    ("a zero", dict(heads=(0, 24, 128)), "three positive integers"),
    ("a bool", dict(heads=(True, 8, 128)), "three positive integers"),
    ("a string", dict(heads=("32", 8, 128)), "three positive integers"),
]


@pytest.mark.parametrize(("case", "change", "needle"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_bad_heads_are_refused(case, change, needle):
    with pytest.raises(ValueError, match=needle):
        _target(**change)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.pop("heads"), "key 'target.heads'"),
        (lambda d: d.update(heads=[32, 8]), "key 'target.heads'"),
        (lambda d: d.update(heads=[32, 8, 0]), "key 'target.heads\\[2\\]'"),
        (lambda d: d.update(heads=[32, 8, "128"]), "key 'target.heads\\[2\\]'"),
        (lambda d: d.update(heads=[32, 4, 128]), "key 'target.heads'.*is not"),
        (lambda d: d.update(epilogue="rmsnorm"), "key 'target.heads'.*only for"),
    ],
)
def test_the_schema_reads_heads_naming_the_key(edit, needle):
    from cudal2.schema import RecordError
    from cudal2.schema import _target as read

    d = json.loads(json.dumps(_target().as_json()))
    assert read(d, "target") == _target()
    edit(d)
    with pytest.raises(RecordError, match=needle):
        read(d, "target")
