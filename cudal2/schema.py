"""The JSON shape of every record of the measurement database, checked key by key.

``parse_line(text)`` reads one line of a database into a ``Measurement`` or a
``SanitizerCheck``, or raises ``RecordError`` naming the key path and what is wrong
(``key 'target.m': must be a positive integer, got '1'``). Nothing is coerced: a
string is not a number, ``true`` is not an integer, a key the schema does not know is
refused (a new field is a new ``schema_version``), and so is a key given twice.
Numbers are finite except where the writer records an unbounded error (``Infinity``
in ``max_abs_err`` of a kernel that left its output unwritten); ``NaN`` never is one.

What the records say about the GPU (a median below the physical floor, a median that
is not the median of its samples) is checked by the database (``cudal2.database``):
this module knows shapes, not hardware.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

from cudal2.migrate import upgrade
from cudal2.records import (
    ACCUMULATORS,
    CHECK_RECORD,
    DTYPES,
    EPILOGUES,
    LAYOUTS,
    SCHEMA_VERSION,
    CheckEvent,
    GpuInfo,
    KernelDesign,
    Knobs,
    Measurement,
    SanitizerCheck,
    Status,
    Target,
    canonical_json,
    heads_problem,
    sha256_hex,
)

MAX_DIM = 2**31 - 1  # M, N, K are C ints in the kernel ABI
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX128 = re.compile(r"[0-9a-f]{128}")
_ARCH = re.compile(r"sm_[0-9]+[a-z]?")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z")
_MEASUREMENT_KEYS = (
    "schema_version",
    "target",
    "design",
    "design_key",
    "artifact_key",
    "status",
    "error",
    "gpu",
    "proposer",
    "tool_version",
    "toolchain",
    "measured_at",
    "max_abs_err",
    "max_rel_err",
    "samples_us",
    "median_us",
    "baselines_us",
    "baseline_samples_us",
    "spread",
    "metrics",
    "mode",
)
_VENDOR_KEYS = ("library", "version", "algo", "workspace_bytes", "config", "name")
_VENDOR_OPTIONAL = ("heuristic_index", "candidates", "candidates_us")
_CHECK_KEYS = (
    "record",
    "schema_version",
    "check",
    "event",
    "gpu",
    "toolchain",
    "artifact_key",
    "target",
    "at",
    "tool_version",
    "error",
)


class RecordError(ValueError):
    """A record that does not follow the schema; the message names the key path."""


def _fail(path: str, why: str, value: Any) -> RecordError:
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return RecordError(f"key '{path}': {why}, got {shown}" if path else f"{why}, got {shown}")


def _obj(v: Any, path: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict:
    """An object of the schema: every required key present, no other than ``optional``."""
    if not isinstance(v, dict):
        raise _fail(path, "a record must be a JSON object" if not path else "must be an object", v)
    required = tuple(required)
    for k in required:
        if k not in v:
            raise RecordError(f"key '{_join(path, k)}' is missing")
    unknown = sorted(set(v) - set(required) - set(optional))
    if unknown:
        raise RecordError(f"key '{_join(path, unknown[0])}' is not in the schema")
    return v


def _map(v: Any, path: str) -> dict:
    """An object whose keys are data (knobs, metrics, baselines), not schema."""
    if not isinstance(v, dict):
        raise _fail(path, "must be an object", v)
    return v


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _str(v: Any, path: str, nonempty: bool = False) -> str:
    if not isinstance(v, str):
        raise _fail(path, "must be a string", v)
    if nonempty and not v:
        raise _fail(path, "must be a non-empty string", v)
    return v


def _choice(v: Any, path: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(v, str) or v not in choices:
        raise _fail(path, f"must be one of {', '.join(choices)}", v)
    return v


def _match(v: Any, path: str, pattern: re.Pattern, what: str) -> str:
    if not isinstance(v, str) or not pattern.fullmatch(v):
        raise _fail(path, f"must be {what}", v)
    return v


def _int(v: Any, path: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        what = {1: "a positive integer", 0: "a non-negative integer"}.get(lo, "an integer")
        raise _fail(path, f"must be {what}" + (f" up to {hi}" if hi is not None else ""), v)
    return v


def _num(v: Any, path: str, *, positive: bool = False, infinite: bool = False) -> float:
    """A number (not a boolean), never NaN; finite unless ``infinite``; >= 0, or > 0
    where ``positive``."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v)
    ok = ok and (infinite or math.isfinite(v)) and (v > 0 if positive else v >= 0)
    if not ok:
        sign = "positive" if positive else "non-negative"
        raise _fail(path, f"must be a {sign} {'number' if infinite else 'finite number'}", v)
    return float(v) if isinstance(v, float) else v


def _opt(v: Any, path: str, read: Callable[..., Any], **kw: Any) -> Any:
    return None if v is None else read(v, path, **kw)


def _samples(v: Any, path: str) -> tuple[float, ...]:
    if not isinstance(v, list):
        raise _fail(path, "must be a list of timing samples", v)
    # The common case at C speed (a comparison with NaN is False); the rest one by one.
    if all(type(x) is float for x in v) and all(0.0 < x < math.inf for x in v):
        return tuple(v)
    return tuple(_num(x, f"{path}[{i}]", positive=True) for i, x in enumerate(v))


# A fused epilogue is spelled only when there is one (a plain target leaves it out)
_FUSED = tuple(e for e in EPILOGUES if e != "none")


def _target(v: Any, path: str) -> Target:
    d = _obj(
        v, path, ("arch", "dtype", "layout", "m", "n", "k", "accumulator"), ("epilogue", "heads")
    )
    epilogue = _choice(d["epilogue"], f"{path}.epilogue", _FUSED) if "epilogue" in d else "none"
    heads: tuple[int, ...] = ()
    if "heads" in d:
        if not isinstance(d["heads"], list) or len(d["heads"]) != 3:
            raise _fail(f"{path}.heads", "must be [q_heads, kv_heads, head_dim]", d["heads"])
        heads = tuple(_int(h, f"{path}.heads[{i}]", 1, MAX_DIM) for i, h in enumerate(d["heads"]))
    problem = heads_problem(epilogue, d.get("n"), heads) if isinstance(d.get("n"), int) else ""
    if problem:
        raise _fail(f"{path}.heads", problem, d.get("heads"))
    return Target(
        _match(d["arch"], f"{path}.arch", _ARCH, "an arch name as sm_90a"),
        _choice(d["dtype"], f"{path}.dtype", DTYPES),
        _choice(d["layout"], f"{path}.layout", LAYOUTS),
        _int(d["m"], f"{path}.m", 1, MAX_DIM),
        _int(d["n"], f"{path}.n", 1, MAX_DIM),
        _int(d["k"], f"{path}.k", 1, MAX_DIM),
        _choice(d["accumulator"], f"{path}.accumulator", ACCUMULATORS),
        epilogue,
        heads,
    )


def _design(v: Any, path: str, target: Target) -> KernelDesign:
    d = _obj(v, path, ("family", "arch", "dtype", "layout", "knobs"))
    knobs = _map(d["knobs"], f"{path}.knobs")
    for name, value in knobs.items():
        if not name.isidentifier():
            raise _fail(f"{path}.knobs", "knob names must be identifiers", name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _fail(f"{path}.knobs.{name}", "must be an integer", value)
    design = KernelDesign(
        _str(d["family"], f"{path}.family", nonempty=True),
        _match(d["arch"], f"{path}.arch", _ARCH, "an arch name as sm_90a"),
        _choice(d["dtype"], f"{path}.dtype", DTYPES),
        _choice(d["layout"], f"{path}.layout", LAYOUTS),
        Knobs.of(**knobs),
    )
    for field in ("arch", "dtype", "layout"):  # measured on a target it was not built for
        if getattr(design, field) != getattr(target, field):
            raise _fail(
                f"{path}.{field}", f"must be the target's ({getattr(target, field)})", d[field]
            )
    # The design's epilogue knob (an index into EPILOGUES, absent for none) is the target's
    fused = knobs.get("epilogue", 0)
    if fused not in range(len(EPILOGUES)) or EPILOGUES[fused] != target.epilogue:
        raise _fail(
            f"{path}.knobs.epilogue",
            f"must be the target's epilogue ({target.epilogue}: "
            f"{EPILOGUES.index(target.epilogue) or 'absent'})",
            fused,
        )
    return design


def _gpu(v: Any, path: str) -> GpuInfo:
    d = _obj(
        v,
        path,
        ("name", "arch", "sm_count", "driver", "cuda_runtime"),
        ("torch", "clocks_mhz", "index", "host"),
    )
    index = d.get("index")
    clocks = _map(d.get("clocks_mhz", {}), f"{path}.clocks_mhz")
    return GpuInfo(
        _str(d["name"], f"{path}.name", nonempty=True),
        _str(d["arch"], f"{path}.arch"),
        _int(d["sm_count"], f"{path}.sm_count", 1),
        _str(d["driver"], f"{path}.driver"),
        _str(d["cuda_runtime"], f"{path}.cuda_runtime"),
        _str(d.get("torch", ""), f"{path}.torch"),
        {k: _int(x, f"{path}.clocks_mhz.{k}") for k, x in clocks.items()},
        None if index is None else _int(index, f"{path}.index"),
        _str(d.get("host", ""), f"{path}.host"),
    )


def _vendor(v: Any, path: str) -> dict[str, Any]:
    d = _obj(v, path, _VENDOR_KEYS, _VENDOR_OPTIONAL)
    _str(d["library"], f"{path}.library", nonempty=True)
    _int(d["version"], f"{path}.version")
    _match(d["algo"], f"{path}.algo", _HEX128, "128 lowercase hex digits")
    _int(d["workspace_bytes"], f"{path}.workspace_bytes")
    config = _map(d["config"], f"{path}.config")
    for k, x in config.items():
        _int(x, f"{path}.config.{k}", lo=-(2**63))
    _str(d["name"], f"{path}.name", nonempty=True)
    if "heuristic_index" in d:
        _int(d["heuristic_index"], f"{path}.heuristic_index")
    if "candidates" in d:
        _int(d["candidates"], f"{path}.candidates")
    if "candidates_us" in d:
        if not isinstance(d["candidates_us"], list):
            raise _fail(f"{path}.candidates_us", "must be a list", d["candidates_us"])
        for i, x in enumerate(d["candidates_us"]):
            _opt(x, f"{path}.candidates_us[{i}]", _num, positive=True, infinite=True)
    return dict(d)


def _number_map(v: Any, path: str, read: Callable[[Any, str], Any]) -> dict[str, Any]:
    return {k: read(x, f"{path}.{k}") for k, x in _map(v, path).items()}


def _metric(v: Any, path: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        raise _fail(path, "must be a number", v)
    return v


def _schema_version(v: Any, path: str) -> int:
    version = _int(v, path, lo=-(2**63))
    if version == 1:
        raise RecordError(
            "schema 1 (written before families owned their knobs): migrate the file with "
            "`python -m cudal2.migrate FILE`"
        )
    if version != SCHEMA_VERSION:
        raise RecordError(f"unknown schema_version {version} (this cudal2 reads {SCHEMA_VERSION})")
    return version


def parse_measurement(obj: Any) -> Measurement:
    """A ``Measurement`` from its JSON object, every key checked (earlier spellings are
    read in today's, ``migrate.upgrade``)."""
    d = _obj(obj, "", _MEASUREMENT_KEYS, ("vendor",))
    version = _schema_version(d["schema_version"], "schema_version")
    _str(d["error"], "error")  # before ``upgrade`` reads it
    d = upgrade(d)
    target = _target(d["target"], "target")
    status = Status(_choice(d["status"], "status", (s.value for s in Status)))
    design = None if d["design"] is None else _design(d["design"], "design", target)
    design_key = _str(d["design_key"], "design_key", nonempty=True)
    artifact_key = _str(d["artifact_key"], "artifact_key", nonempty=True)
    vendor = _vendor(d["vendor"], "vendor") if "vendor" in d else {}
    if design is not None:
        if design_key != design.key:
            raise _fail(
                "design_key", "must be the sha256 of the design's canonical JSON", design_key
            )
        _match(artifact_key, "artifact_key", _HEX64, "64 lowercase hex digits")
    if vendor:
        if design is not None:
            raise _fail("design", "must be null in a vendor record", d["design"])
        algo = {k: vendor[k] for k in ("library", "version", "algo")}
        key = f"cublaslt:{sha256_hex(canonical_json(algo))}"
        for name, value in (("design_key", design_key), ("artifact_key", artifact_key)):
            if value != key:
                raise _fail(
                    name, "must be the hash of the vendor's library, version and algo", value
                )
    samples = _samples(d["samples_us"], "samples_us")
    median = _opt(d["median_us"], "median_us", _num, positive=True)
    baselines = _number_map(
        d["baselines_us"], "baselines_us", lambda x, p: _num(x, p, positive=True)
    )
    base_samples = _number_map(d["baseline_samples_us"], "baseline_samples_us", _samples)
    spread = _opt(d["spread"], "spread", _num)
    if median is not None and not samples:
        raise _fail("samples_us", "must hold the samples median_us is the median of", [])
    for k in base_samples:
        if k not in baselines:
            raise RecordError(f"key 'baselines_us.{k}' is missing (its samples are recorded)")
    if status == Status.OK:  # a timed record: what the selection reads must be there
        if median is None:
            raise _fail("median_us", "must be a number in a record of status ok", None)
        if "torch" not in baselines:
            raise RecordError("key 'baselines_us.torch' is missing (status ok: timed beside torch)")
        if spread is None:
            raise _fail("spread", "must be a number in a record of status ok", None)
    finite = status == Status.OK  # a correct kernel's error is bounded
    return Measurement(
        target=target,
        design=design,
        design_key=design_key,
        artifact_key=artifact_key,
        status=status,
        gpu=_gpu(d["gpu"], "gpu"),
        proposer=_str(d["proposer"], "proposer", nonempty=True),
        tool_version=_str(d["tool_version"], "tool_version"),
        toolchain=_str(d["toolchain"], "toolchain", nonempty=True),
        measured_at=_match(
            d["measured_at"], "measured_at", _TIMESTAMP, "a UTC time as 2026-11-21T17:22:40Z"
        ),
        error=_str(d["error"], "error"),
        max_abs_err=_opt(d["max_abs_err"], "max_abs_err", _num, infinite=not finite),
        max_rel_err=_opt(d["max_rel_err"], "max_rel_err", _num, infinite=not finite),
        samples_us=samples,
        median_us=median,
        baselines_us=baselines,
        baseline_samples_us=base_samples,
        spread=spread,
        metrics=_number_map(d["metrics"], "metrics", _metric),
        mode=_str(d["mode"], "mode", nonempty=True),
        schema_version=version,
        vendor=vendor,
    )


def parse_check(obj: dict[str, Any]) -> SanitizerCheck:
    """A ``SanitizerCheck`` from its JSON object, every key checked."""
    d = _obj(obj, "", _CHECK_KEYS)
    version = _schema_version(d["schema_version"], "schema_version")
    event = CheckEvent(_choice(d["event"], "event", (e.value for e in CheckEvent)))
    return SanitizerCheck(
        check=_match(d["check"], "check", _HEX32, "32 lowercase hex digits"),
        event=event,
        gpu=_str(d["gpu"], "gpu", nonempty=True),
        toolchain=_str(d["toolchain"], "toolchain", nonempty=True),
        artifact_key=_match(d["artifact_key"], "artifact_key", _HEX64, "64 lowercase hex digits"),
        target=_target(d["target"], "target"),
        at=_match(d["at"], "at", _TIMESTAMP, "a UTC time as 2026-11-21T17:22:40Z"),
        tool_version=_str(d["tool_version"], "tool_version"),
        error=_str(d["error"], "error"),
        schema_version=version,
    )


def parse_line(text: str) -> Measurement | SanitizerCheck:
    """One database line: JSON (no NaN, no repeated keys, no nesting deeper than a
    record has) holding a measurement or a sanitizer check."""
    try:
        obj = json.loads(text, object_pairs_hook=_unique, parse_constant=_constant)
    except RecursionError:
        raise RecordError("not JSON: nested deeper than any record") from None
    except ValueError as e:  # JSONDecodeError, int too long, our hooks
        if isinstance(e, RecordError):
            raise
        raise RecordError(f"not JSON ({e})") from None
    if isinstance(obj, dict) and "record" in obj:
        kind = obj["record"]
        if kind != CHECK_RECORD:
            raise _fail("record", f"must be {CHECK_RECORD!r} (or absent: a measurement)", kind)
        return parse_check(obj)
    return parse_measurement(obj)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise RecordError(f"key '{k}' is given twice in one object")
        d[k] = v
    return d


def _constant(name: str) -> float:
    if name == "NaN":
        raise RecordError("NaN is not a number any record holds")
    return float(name)  # Infinity, -Infinity: refused later where a field must be finite
