"""Targets with a fused epilogue: the field, its JSON and key, validation when read."""

from __future__ import annotations

import json

import pytest

from cudal2.database import MeasurementDB
from cudal2.manifest import default_manifest_path
from cudal2.records import (
    EPILOGUE_OPERANDS,
    EPILOGUES,
    ROPE_KV,
    Target,
    canonical_json,
    sha256_hex,
)

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
    heads = (24, 4, 128) if epilogue in ROPE_KV else ()  # (24 + 2 * 4) * 128 = 4096
    t = Target("sm_90a", "fp16", "tn", 16, 4096, 4096, epilogue=epilogue, heads=heads)
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


def _fused_record(recorded_measurements, epilogue: str = "residual"):
    """A recorded sm90tma measurement as if it had been of a fused epilogue (a schema
    case: its numbers are the plain kernel's)."""
    import dataclasses

    from cudal2.generator.families.base import with_epilogue

    m = next(x for x in recorded_measurements if x.design and x.design.family == "sm90tma")
    t = dataclasses.replace(m.target, epilogue=epilogue)
    d = with_epilogue(m.design, epilogue)
    return dataclasses.replace(m, target=t, design=d, design_key=d.key)


def test_a_fused_record_passes_the_database_schema(tmp_path, recorded_measurements):
    rec = _fused_record(recorded_measurements)
    db = MeasurementDB(tmp_path / "db.jsonl")
    db.append([rec])
    (back,) = db.load().measurements
    assert back.target.epilogue == "residual" and back == rec


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d["target"].update(epilogue="none"), "key 'target.epilogue'"),
        (lambda d: d["target"].update(epilogue="gelu"), "key 'target.epilogue'"),
        (lambda d: d["target"].update(epilogue=2), "key 'target.epilogue'"),
        (lambda d: d["design"]["knobs"].update(epilogue=1), "key 'design.knobs.epilogue'"),
        (lambda d: d["design"]["knobs"].pop("epilogue"), "key 'design.knobs.epilogue'"),
        (lambda d: d["target"].pop("epilogue"), "key 'design.knobs.epilogue'"),
    ],
)
def test_a_fused_record_that_does_not_agree_is_refused(recorded_measurements, edit, needle):
    from cudal2.schema import RecordError, parse_measurement

    d = json.loads(json.dumps(_fused_record(recorded_measurements).as_json()))
    edit(d)
    d.pop("design_key", None)
    with pytest.raises(RecordError, match=needle.replace(".", "\\.")):
        parse_measurement({**d, "design_key": "0" * 64})


# The fused prefill's H100 run (ci/gpu_prefill_fused.sh): its row-scaled records time
# torch's RMSNorm beside the GEMM (baselines_us.rms_norm, about 14.4 us at
# 2048x6144x4096), far below the GEMM's floor (104 us), and every one of them was skipped
# as a measurement error when read, until the norm had a floor of its own.
SELECT_RUN = "bench/results/h100-llama-prefill-fused-select.measurements.jsonl.gz"


def _norm_record(scale_norm: float) -> str:
    import gzip

    from cudal2.records import NORM_BASELINE

    with gzip.open(SELECT_RUN, "rt") as f:
        line = next(x for x in f if f'"{NORM_BASELINE}"' in x and '"ok"' in x)
    d = json.loads(line)
    for key in ("baselines_us", "baseline_samples_us"):
        v = d[key][NORM_BASELINE]
        d[key][NORM_BASELINE] = (
            [x * scale_norm for x in v] if isinstance(v, list) else v * scale_norm
        )
    return json.dumps(d)


# (id, the norm's times scaled by, what the read says: None kept, else the skip's reason)
NORM_FLOOR_CASES = [
    ("as-measured", 1.0, None),
    ("a-tenth-of-it", 0.1, "baselines_us.rms_norm 1.4"),  # below A's one read: 5 us
    ("under-a-read-of-a", 0.3, "below the physical floor"),
]


@pytest.mark.parametrize(
    "case_id, scale, skipped", NORM_FLOOR_CASES, ids=[c[0] for c in NORM_FLOOR_CASES]
)
def test_torchs_rmsnorm_beside_a_row_scaled_gemm_has_a_floor_of_its_own(
    tmp_path, case_id, scale, skipped
):
    path = tmp_path / "db.jsonl"
    path.write_text(_norm_record(scale) + "\n")
    contents = MeasurementDB(path).load(warn=False)
    if skipped is None:
        assert len(contents.measurements) == 1 and contents.skipped == ()
    else:
        assert not contents.measurements
        assert skipped in contents.skipped[0].reason
