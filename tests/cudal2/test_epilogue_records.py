"""Targets with a fused epilogue: the field, its JSON and key, validation when read."""

from __future__ import annotations

import json

import pytest

from cudal2.database import MeasurementDB
from cudal2.manifest import default_manifest_path
from cudal2.records import EPILOGUE_OPERANDS, EPILOGUES, Target, canonical_json, sha256_hex

# The key of a plain target as every committed database and table names it (computed
# before the epilogue field existed).
PLAIN_KEY = "97720e78e4b264e0fff799f24cfc0f5d67582951779116812483c351548aedd0"


def test_a_plain_targets_key_is_what_it_was():
    t = Target("sm_90a", "fp16", "tn", 1, 4096, 4096)
    assert "epilogue" not in t.as_json()
    assert t.key == PLAIN_KEY


def test_committed_records_keep_their_target_keys():
    """Every committed record's target reads back to the same JSON (so the same key)."""
    path = default_manifest_path().with_name("default.measurements.jsonl")
    with open(path) as f:
        stored = [json.loads(line)["target"] for line in f if line.strip()]
    assert stored
    for d in stored:
        t = Target.from_json(d)
        assert t.epilogue == "none"
        assert t.key == sha256_hex(canonical_json(d))
    assert MeasurementDB(path).read()


@pytest.mark.parametrize("epilogue", [e for e in EPILOGUES if e != "none"])
def test_an_epilogue_target_round_trips_with_its_own_key(epilogue):
    t = Target("sm_90a", "fp16", "tn", 16, 4096, 4096, epilogue=epilogue)
    d = t.as_json()
    assert d["epilogue"] == epilogue
    assert Target.from_json(json.loads(json.dumps(d))) == t
    assert t.key != t.plain.key
    assert t.plain.key == Target("sm_90a", "fp16", "tn", 16, 4096, 4096).key
    assert epilogue in t.label


def test_the_epilogue_operands_count_in_the_byte_floor():
    t = Target("sm_90a", "fp16", "tn", 16, 4096, 1024)
    assert Target(**{**t.as_json(), "epilogue": "bias"}).min_bytes == t.min_bytes + 2 * 4096
    both = Target(**{**t.as_json(), "epilogue": "bias_residual"})
    assert both.min_bytes == t.min_bytes + 2 * (4096 + 16 * 4096)
    assert set(EPILOGUE_OPERANDS) == set(EPILOGUES)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"epilogue": "gelu"}, "epilogue 'gelu' is not one of"),
        ({"epilogue": ""}, "epilogue '' is not one of"),
        ({"epilogue": "Bias"}, "epilogue 'Bias' is not one of"),
        ({"epilogues": "bias"}, "unknown target fields \\['epilogues'\\]"),
    ],
)
def test_a_bad_epilogue_is_a_clear_error_when_read(change, error):
    d = {**Target("sm_90a", "fp16", "tn", 1, 64, 64).as_json(), **change}
    with pytest.raises(ValueError, match=error):
        Target.from_json(d)
