"""Typed, frozen, serialisable records shared by every stage of the pipeline.

Imports flow one way: records <- generator <- verify <- policy; packaging reads
records and artifacts only. This module imports nothing from the rest of cudal2.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

# 2: designs carry their family's own knobs (``KernelDesign.knobs``); 1: flat knobs.
SCHEMA_VERSION = 2

Dtype = Literal["fp16", "bf16"]
Layout = Literal["tn", "nn"]


class Status(enum.StrEnum):
    """What became of a measured candidate: ``ok`` (checked and timed) or why it has no
    time. Spelled in JSON as its value; the one list of statuses (the policy derives its
    tokens from it)."""

    OK = "ok"
    COMPILE = "compile"  # nvcc failed
    RUNTIME = "runtime"  # raised, or took its worker down (a CUDA error)
    INCORRECT = "incorrect"  # failed the correctness suite
    TIMEOUT = "timeout"  # no answer within the job timeout (a hang)
    ILLEGAL = "illegal"  # reserved: proposers only propose legal designs
    SANITIZER = "sanitizer"  # compute-sanitizer memcheck found an error: never ships


DTYPES: tuple[str, ...] = ("fp16", "bf16")
LAYOUTS: tuple[str, ...] = ("tn", "nn")
ARCHS: tuple[str, ...] = ("sm_90a",)
ACCUMULATORS: tuple[str, ...] = ("fp32",)
# Fused epilogues: what the kernel does to the fp32 accumulator before its single
# rounding to the output dtype. ``none``: a plain GEMM (the field is left out of a
# target's JSON, so every record written before epilogues existed keeps its key);
# ``bias``: + b[N] broadcast over the rows; ``residual``: + r[M, N] (row-major, unit
# inner stride, the output's dtype; the output may alias it); ``bias_residual``: both.
# Gated activations (``silu``, ``gelu_tanh``): B is a packed gate_up weight [N, K]
# whose rows alternate gate, up (row 2j is gate row j, row 2j + 1 up row j), and the
# output is [M, N / 2]: C[m, j] = act(acc[m, 2j]) * acc[m, 2j + 1]. RMSNorm row scale
# (``rmsnorm``...): A is the un-normalised activation h and B the weight with the
# norm's weight folded in (W[n, k] * g[k]); every accumulator of row m is multiplied by
# rsqrt(sum_k h[m, k]^2 / K + eps) (``eps``: a launch parameter), before the bias
# (``rmsnorm_bias``) or the gated activation (``rmsnorm_silu``, ``rmsnorm_gelu_tanh``).
# RoPE and the KV-cache write (``rmsnorm_rope_kv``, ``rmsnorm_bias_rope_kv``: ROPE_KV):
# the qkv projection of an attention layer whose head split is the target's ``heads``
# (q_heads, kv_heads, head_dim); after the row scale (and the bias), q and k heads are
# rotated (transformers' rotate_half convention, B's rows of every q and k head
# interleaved in RoPE pairs: ``rope_kv.pack_rope_rows`` in the runtime), q is the output
# [M, q_heads * head_dim] and k, v go straight into the KV cache (docs/kernels.md).
# The index of a name is its value as a design knob (``epilogue``, sm90tma): new names
# are appended, never inserted.
EPILOGUES: tuple[str, ...] = (
    "none",
    "bias",
    "residual",
    "bias_residual",
    "silu",
    "gelu_tanh",
    "rmsnorm",
    "rmsnorm_bias",
    "rmsnorm_silu",
    "rmsnorm_gelu_tanh",
    "rmsnorm_rope_kv",
    "rmsnorm_bias_rope_kv",
)
# Which operands an epilogue reads, by name (the ABI gemm_v3 pointers it sets).
EPILOGUE_OPERANDS: dict[str, tuple[str, ...]] = {
    "none": (),
    "bias": ("bias",),
    "residual": ("residual",),
    "bias_residual": ("bias", "residual"),
    "silu": (),
    "gelu_tanh": (),
    "rmsnorm": (),
    "rmsnorm_bias": ("bias",),
    "rmsnorm_silu": (),
    "rmsnorm_gelu_tanh": (),
    "rmsnorm_rope_kv": (),
    "rmsnorm_bias_rope_kv": ("bias",),
}
# The gated activation an epilogue applies (absent: none; its output has N / 2 columns).
EPILOGUE_ACTIVATION: dict[str, str] = {
    "silu": "silu",
    "gelu_tanh": "gelu_tanh",
    "rmsnorm_silu": "silu",
    "rmsnorm_gelu_tanh": "gelu_tanh",
}
# The epilogues with the RMSNorm row scale (their gemm_v3 kernels take ``float eps``).
ROW_SCALED: frozenset[str] = frozenset(
    (
        "rmsnorm",
        "rmsnorm_bias",
        "rmsnorm_silu",
        "rmsnorm_gelu_tanh",
        "rmsnorm_rope_kv",
        "rmsnorm_bias_rope_kv",
    )
)
# A row-scaled epilogue's twins (the runtime's ``api.NORMED_TWINS``): where a call of it
# finds no kernel of its own (no entry, or a fallback entry), torch's RMSNorm runs and
# then the first twin's entry. The selection prefers that path where it is measured
# faster than the row-scaled kernel (``pipeline.select.prefer_twins``).
NORMED_TWINS: dict[str, tuple[str, ...]] = {
    "rmsnorm": ("none",),
    "rmsnorm_bias": ("bias", "none"),
    "rmsnorm_silu": ("silu",),
    "rmsnorm_gelu_tanh": ("gelu_tanh",),
}
# The baseline timed beside a NORMED_TWINS target's candidates besides torch's unfused
# op: torch's RMSNorm of A alone (``F.rms_norm``, what the twin path runs first).
NORM_BASELINE = "rms_norm"
# What a run-off's rival algorithm carries to the worker (``Job.rival``): the cuBLASLt
# record's design key (the name of its baseline in the kernel's record) and what
# ``LtGemm`` needs to run it. A record's baseline whose name starts with ``cublaslt:`` is
# such a rival, timed beside the kernel (``pipeline.runoff``).
RIVAL_FIELDS = ("design_key", "library", "version", "algo")
# The epilogues that apply RoPE and write K and V into the KV cache: their gemm_v3
# kernels take, after eps, the operands of ``ROPE_KV_OPERANDS`` (the runtime's
# ``abi.RopeKvArgs``); their targets carry ``heads``.
ROPE_KV: frozenset[str] = frozenset(("rmsnorm_rope_kv", "rmsnorm_bias_rope_kv"))
# What a ROPE_KV epilogue reads or writes beyond A, B, C (and the bias): cos, sin [M, D]
# (the output dtype, row stride D), the caches [B, kv_heads, L, D] (written), and the
# cache positions (int64 [S]: row m = b * S + s goes to slot positions[s]).
ROPE_KV_OPERANDS: tuple[str, ...] = ("cos", "sin", "k_cache", "v_cache", "positions")


def heads_problem(epilogue: str, n: int, heads: tuple[int, ...]) -> str:
    """Why ``heads`` (q_heads, kv_heads, head_dim) cannot be a target's with epilogue
    ``epilogue`` and N = ``n`` ("" when it can): required for a ROPE_KV epilogue and
    refused for every other; three positive integers, an even head_dim, and
    N == (q_heads + 2 kv_heads) * head_dim."""
    if epilogue not in ROPE_KV:
        return (
            f"heads {list(heads)} is only for the rope_kv epilogues {sorted(ROPE_KV)}"
            if heads
            else ""
        )
    if not heads:
        return f"epilogue {epilogue!r} needs heads = [q_heads, kv_heads, head_dim]"
    if len(heads) != 3 or any(
        isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in heads
    ):
        return (
            "heads must be three positive integers [q_heads, kv_heads, head_dim], "
            f"got {list(heads)}"
        )
    q, kv, d = heads
    if d % 2:
        return f"heads: head_dim {d} must be even (RoPE rotates pairs)"
    if (q + 2 * kv) * d != n:
        want = (q + 2 * kv) * d
        return f"heads {list(heads)}: N = {n} is not (q_heads + 2 kv_heads) * head_dim = {want}"
    return ""


def out_columns(epilogue: str, n: int, heads: tuple[int, ...] = ()) -> int:
    """The output's columns of a GEMM of N = ``n`` with ``epilogue`` (half for a gated
    activation: one per gate, up pair; q_heads * head_dim of ``heads`` for a ROPE_KV one:
    q only, k and v go to the cache)."""
    if epilogue in ROPE_KV:
        return heads[0] * heads[2]
    return n // 2 if epilogue in EPILOGUE_ACTIVATION else n


STATUSES: tuple[str, ...] = tuple(s.value for s in Status)


def canonical_json(obj: Any) -> str:
    """The one JSON spelling used for hashing: sorted keys, no whitespace."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode()
    return hashlib.sha256(data).hexdigest()


class ReuseKey(NamedTuple):
    """What a measurement stands for: another run with the same GPU model, target (its
    key), artifact (source, nvcc, flags), toolchain (nvcc or library version, and the
    timing method) and timing mode. One definition for records (``Measurement.reuse_key``)
    and for jobs (``Job.reuse_key``)."""

    gpu: str
    target: str
    artifact: str
    toolchain: str
    mode: str

    def autotuned(self) -> ReuseKey:
        """The key of an autotuning: the algorithm (the artifact) is what tuning finds,
        so it is not part of what a job asks for."""
        return self._replace(artifact=AUTOTUNED)


AUTOTUNED = "cublaslt:autotuned"  # the artifact of an autotuning job's key


@dataclass(frozen=True, order=True)
class Target:
    """One GEMM the user cares about.

    layout ``tn``: C[M,N] = A[M,K] @ B[N,K]^T, B row-major (nn.Linear: x @ W^T).
    layout ``nn``: C[M,N] = A[M,K] @ B[K,N], both row-major (torch.matmul).
    All operands and the output are row-major with unit inner stride.

    ``epilogue`` (one of ``EPILOGUES``): the fused op after the GEMM, e.g. ``residual``
    is C = A @ B^T + R. Left out of the JSON (and so of the key) when ``none``: a plain
    target's JSON and key are what they were before epilogues existed.

    ``heads`` (q_heads, kv_heads, head_dim): the attention head split a ROPE_KV
    epilogue needs (required there, refused elsewhere: ``heads_problem``); left out of
    the JSON when empty, so every other target's key is what it was.
    """

    arch: str
    dtype: str
    layout: str
    m: int
    n: int
    k: int
    accumulator: str = "fp32"
    epilogue: str = "none"
    heads: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue {self.epilogue!r} is not one of {EPILOGUES}")
        if self.epilogue in EPILOGUE_ACTIVATION and self.n % 2:
            raise ValueError(
                f"epilogue {self.epilogue!r} needs an even N (gate, up row pairs), got {self.n}"
            )
        if not isinstance(self.heads, tuple):  # a JSON list
            object.__setattr__(self, "heads", tuple(self.heads))
        problem = heads_problem(self.epilogue, self.n, self.heads)
        if problem:
            raise ValueError(f"target {self.m}x{self.n}x{self.k} +{self.epilogue}: {problem}")

    def as_json(self) -> dict[str, Any]:
        # Every field is a str or an int: no need for asdict's recursive deep copy,
        # which dominated the proposers' cost (keys are hashed over whole spaces).
        d = {f: getattr(self, f) for f in _TARGET_FIELDS}
        if self.epilogue == "none":
            del d["epilogue"]
        if self.heads:
            d["heads"] = list(self.heads)
        else:
            del d["heads"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Target:
        extra = set(d) - set(_TARGET_FIELDS)
        if extra:
            raise ValueError(f"unknown target fields {sorted(extra)}: {str(d)[:160]}")
        return cls(**d)

    @property
    def key(self) -> str:
        return sha256_hex(canonical_json(self.as_json()))

    @property
    def label(self) -> str:
        tail = "" if self.epilogue == "none" else f" +{self.epilogue}"
        if self.heads:
            tail += " heads " + "/".join(map(str, self.heads))
        return f"{self.dtype}/{self.layout} {self.m}x{self.n}x{self.k}{tail}"

    @property
    def plain(self) -> Target:
        """The same GEMM without its epilogue (what the vendor baseline computes)."""
        return dataclasses.replace(self, epilogue="none", heads=())

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def out_n(self) -> int:
        """The output's columns: N, or N / 2 after a gated activation."""
        return out_columns(self.epilogue, self.n, self.heads)

    @property
    def min_bytes(self) -> int:
        """Each operand read once and the output ([M, out_n]) written once (2-byte
        elements), and the epilogue's operands read once (bias [N], residual [M, N]); a
        ROPE_KV epilogue's cos and sin read ([M, head_dim] each) and its k and v rows
        written into the cache ([M, kv_heads * head_dim] each)."""
        extra = {"bias": self.n, "residual": self.m * self.n}
        epi = sum(extra[o] for o in EPILOGUE_OPERANDS[self.epilogue])
        if self.epilogue in ROPE_KV:
            _, kv, d = self.heads
            epi += 2 * self.m * d + 2 * self.m * kv * d
        return 2 * (self.m * self.k + self.n * self.k + self.m * self.out_n + epi)


@dataclass(frozen=True, order=True)
class Knobs:
    """A kernel family's knob values, by name: immutable, hashable, and equal when the
    values are (kept sorted by name). Read one as an attribute, ``d.knobs.stages``.

    Which names a family has, their domains and what they mean is the family's
    declaration (``cudal2.generator.families``); this record only carries values.
    """

    items: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        for name, value in self.items:
            if not isinstance(name, str) or not name.isidentifier():
                raise ValueError(f"knob name {name!r} is not an identifier")
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"knob {name} = {value!r}: a knob value is an integer")
        names = [name for name, _ in self.items]
        if names != sorted(set(names)):
            object.__setattr__(self, "items", tuple(sorted(dict(self.items).items())))
            if len(self.items) != len(names):
                raise ValueError(f"knob names repeat: {names}")

    @classmethod
    def of(cls, **values: int) -> Knobs:
        return cls(tuple(sorted(values.items())))

    def __getattr__(self, name: str) -> int:
        # Called only when normal lookup fails: a knob's value, by name.
        for key, value in object.__getattribute__(self, "items"):
            if key == name:
                return value
        raise AttributeError(f"no knob {name!r} (knobs: {[k for k, _ in self.items]})")

    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.items)

    def replace(self, **changes: int) -> Knobs:
        unknown = set(changes) - set(self.names())
        if unknown:
            raise ValueError(f"no knobs {sorted(unknown)} (knobs: {list(self.names())})")
        return Knobs.of(**{**dict(self.items), **changes})

    def as_json(self) -> dict[str, int]:
        return dict(self.items)


class DesignFormatError(ValueError):
    """A design record this version cannot read (e.g. one of schema 1, written before
    families owned their knobs: migrate it with ``python -m cudal2.migrate``)."""


@dataclass(frozen=True, order=True)
class KernelDesign:
    """One point of a kernel family's design space: the family, what it is built for
    (arch, dtype, layout) and the family's own knob values.

    A design is shape-generic: its cubin takes M, N, K and the leading dimensions at
    run time and is correct for every size >= 1 that meets the family's alignment
    rule. Everything the knobs mean — their names and domains, legality, the launch
    recipe, the template context, the design's name, the cost model's features and the
    policy's tokens — comes from the family's declaration
    (``cudal2.generator.families``); this record carries the values. ``key`` is the
    sha256 of its canonical JSON.
    """

    family: str
    arch: str
    dtype: str
    layout: str
    knobs: Knobs

    def as_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "arch": self.arch,
            "dtype": self.dtype,
            "layout": self.layout,
            "knobs": self.knobs.as_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KernelDesign:
        if not isinstance(d, dict) or not isinstance(d.get("knobs"), dict):
            raise DesignFormatError(
                f"not a design of this schema (no 'knobs' object): {str(d)[:120]}; a record "
                "written before families owned their knobs is migrated with "
                "`python -m cudal2.migrate FILE`"
            )
        extra = set(d) - {"family", "arch", "dtype", "layout", "knobs"}
        if extra:
            raise DesignFormatError(f"unknown design fields {sorted(extra)}")
        return cls(d["family"], d["arch"], d["dtype"], d["layout"], Knobs.of(**d["knobs"]))

    @property
    def key(self) -> str:
        """sha256 of the canonical JSON of the design."""
        return sha256_hex(canonical_json(self.as_json()))

    def replace(self, **knobs: int) -> KernelDesign:
        """The same design with some knob values changed."""
        return dataclasses.replace(self, knobs=self.knobs.replace(**knobs))


_TARGET_FIELDS = tuple(f.name for f in dataclasses.fields(Target))


@dataclass(frozen=True)
class BuildResult:
    """The outcome of compiling one design: an artifact key, or the compiler's error.

    ``cubin_sha256`` / ``cubin_size``: of the bytes nvcc wrote (a successful compile's
    cubin; empty / None otherwise), which every reader of the artifact cache checks."""

    design_key: str
    artifact_key: str
    ok: bool
    symbol: str
    error: str = ""
    registers: int | None = None
    spill_bytes: int | None = None
    smem_static: int | None = None
    nvcc_version: str = ""
    flags: tuple[str, ...] = ()
    cubin_sha256: str = ""
    cubin_size: int | None = None

    def as_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["flags"] = list(self.flags)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BuildResult:
        d = dict(d)
        d["flags"] = tuple(d.get("flags", ()))
        return cls(**d)


@dataclass(frozen=True)
class GpuInfo:
    """The GPU a measurement was taken on, as found (clocks are never changed)."""

    name: str
    arch: str
    sm_count: int
    driver: str
    cuda_runtime: str
    torch: str = ""
    clocks_mhz: dict[str, int] = field(default_factory=dict)
    # Which GPU of which host answered (a runner with several GPUs tags every result;
    # None / "": not recorded, as in records made before multi-GPU runners).
    index: int | None = None
    host: str = ""

    def as_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        # Untagged records keep the shape they always had.
        if d["index"] is None:
            del d["index"]
        if not d["host"]:
            del d["host"]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuInfo:
        return cls(**d)

    @property
    def where(self) -> str:
        """The GPU as a person names it in a log: model, and host:index where tagged."""
        at = ":".join(x for x in (self.host, "" if self.index is None else str(self.index)) if x)
        return f"{self.name} ({at})" if at else self.name


@dataclass(frozen=True)
class Measurement:
    """One candidate (or baseline-only) measured on one target on one GPU.

    Failed candidates are kept with their status and error text: the policy
    learns from them. ``samples_us`` holds every timing sample of the candidate;
    ``baselines_us`` the median of each baseline timed in the same process,
    ``baseline_samples_us`` their samples.

    A vendor record (``design`` None, ``vendor`` set) is a library algorithm measured
    the same way: ``vendor = {"library": "cublaslt", "version", "algo" (hex of the
    64-byte cublasLtMatmulAlgo_t), "workspace_bytes", "config", "name", ...}``, its
    ``design_key`` and ``artifact_key`` a hash of (library, version, algo). Left out
    of ``as_json`` when empty, so every kernel record keeps its bytes.
    """

    target: Target
    design: KernelDesign | None
    design_key: str
    artifact_key: str
    status: Status
    gpu: GpuInfo
    proposer: str
    tool_version: str
    toolchain: str
    measured_at: str
    error: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    samples_us: tuple[float, ...] = ()
    median_us: float | None = None
    baselines_us: dict[str, float] = field(default_factory=dict)
    baseline_samples_us: dict[str, tuple[float, ...]] = field(default_factory=dict)
    spread: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    mode: str = "offline"
    schema_version: int = SCHEMA_VERSION
    vendor: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A status given as its string (from JSON, or by hand) becomes the enum; an
        # unknown one is refused here rather than stored.
        object.__setattr__(self, "status", Status(self.status))

    def as_json(self) -> dict[str, Any]:
        d = {
            "schema_version": self.schema_version,
            "target": self.target.as_json(),
            "design": self.design.as_json() if self.design else None,
            "design_key": self.design_key,
            "artifact_key": self.artifact_key,
            "status": self.status.value,
            "error": self.error,
            "gpu": self.gpu.as_json(),
            "proposer": self.proposer,
            "tool_version": self.tool_version,
            "toolchain": self.toolchain,
            "measured_at": self.measured_at,
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "samples_us": list(self.samples_us),
            "median_us": self.median_us,
            "baselines_us": dict(self.baselines_us),
            "baseline_samples_us": {k: list(v) for k, v in self.baseline_samples_us.items()},
            "spread": self.spread,
            "metrics": dict(self.metrics),
            "mode": self.mode,
        }
        if self.vendor:
            d["vendor"] = dict(self.vendor)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Measurement:
        return cls(
            target=Target.from_json(d["target"]),
            design=KernelDesign.from_json(d["design"]) if d.get("design") else None,
            design_key=d["design_key"],
            artifact_key=d["artifact_key"],
            status=d["status"],
            error=d.get("error", ""),
            gpu=GpuInfo.from_json(d["gpu"]),
            proposer=d["proposer"],
            tool_version=d["tool_version"],
            toolchain=d["toolchain"],
            measured_at=d["measured_at"],
            max_abs_err=d.get("max_abs_err"),
            max_rel_err=d.get("max_rel_err"),
            samples_us=tuple(d.get("samples_us", ())),
            median_us=d.get("median_us"),
            baselines_us=dict(d.get("baselines_us", {})),
            baseline_samples_us={k: tuple(v) for k, v in d.get("baseline_samples_us", {}).items()},
            spread=d.get("spread"),
            metrics=dict(d.get("metrics", {})),
            mode=d.get("mode", "offline"),
            schema_version=d.get("schema_version", SCHEMA_VERSION),
            vendor=dict(d.get("vendor") or {}),
        )

    @property
    def is_vendor(self) -> bool:
        return bool(self.vendor)

    @property
    def reuse_key(self) -> ReuseKey:
        gpu, target = self.gpu.name, self.target.key
        return ReuseKey(gpu, target, self.artifact_key, self.toolchain, self.mode)

    @property
    def tuning_key(self) -> ReuseKey:
        """A vendor record stands for an autotuning job of its GPU model, target,
        library version and mode, whichever algorithm the tuning found."""
        return self.reuse_key.autotuned()


class CheckEvent(enum.StrEnum):
    """One line of a compute-sanitizer check in the measurement database: announced
    before memcheck runs (``started``), then its verdict (``clean`` or ``failed``). A
    check whose verdict never reached the file (a crash, a torn or lost line) stays
    started: pending, and a pending check ships nothing."""

    STARTED = "started"
    CLEAN = "clean"
    FAILED = "failed"


CHECK_RECORD = "sanitizer_check"  # the ``record`` key that tells a check line from a measurement


class CheckKey(NamedTuple):
    """What a clean check vouches for: one artifact, checked at one target's residues,
    on one GPU model, with one toolchain (the measured record's)."""

    gpu: str
    toolchain: str
    artifact: str
    target: str  # Target.key


@dataclass(frozen=True)
class SanitizerCheck:
    """One line of a compute-sanitizer memcheck of a kernel artifact at a target (run at
    the small size ``verify.sanitizer.small`` cuts it to) on a GPU model, with the
    toolchain of the measurement it checks.

    The build appends a ``started`` line (fsynced) before memcheck runs, then the
    verdict line (same ``check`` id, ``clean`` or ``failed`` with the report in
    ``error``). A failure recorded before checks existed (a ``Measurement`` of status
    ``sanitizer``) reads as a ``failed`` line without an id (``of_failure``). Which
    lines let a kernel ship is ``cudal2.verdicts.SanitizerLedger``'s rule.
    """

    check: str  # 32 hex digits, shared by the started line and its verdict; "" legacy
    event: CheckEvent
    gpu: str  # the GPU model memcheck ran on
    toolchain: str
    artifact_key: str
    target: Target
    at: str  # UTC, YYYY-MM-DDTHH:MM:SSZ
    tool_version: str
    error: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        object.__setattr__(self, "event", CheckEvent(self.event))

    @property
    def key(self) -> CheckKey:
        return CheckKey(self.gpu, self.toolchain, self.artifact_key, self.target.key)

    def verdict(self, clean: bool, at: str, error: str = "") -> SanitizerCheck:
        """The verdict line of this started check."""
        event = CheckEvent.CLEAN if clean else CheckEvent.FAILED
        return dataclasses.replace(self, event=event, at=at, error="" if clean else error)

    @classmethod
    def of_failure(cls, m: Measurement) -> SanitizerCheck:
        """A failure recorded as a measurement of status ``sanitizer`` (before checks
        were lines of their own), as a check line without an id."""
        return cls(
            "",
            CheckEvent.FAILED,
            m.gpu.name,
            m.toolchain,
            m.artifact_key,
            m.target,
            m.measured_at,
            m.tool_version,
            m.error,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "record": CHECK_RECORD,
            "schema_version": self.schema_version,
            "check": self.check,
            "event": self.event.value,
            "gpu": self.gpu,
            "toolchain": self.toolchain,
            "artifact_key": self.artifact_key,
            "target": self.target.as_json(),
            "at": self.at,
            "tool_version": self.tool_version,
            "error": self.error,
        }


@dataclass(frozen=True)
class TimingConfig:
    """How a job times its callables (``verify.timing.time_interleaved``); ``mode`` is
    the timing mode a record is reused for."""

    reps: int = 30
    warmup: int = 3
    mode: str = "offline"
    min_replay_us: float = 300.0  # offline: a replay lasts at least this long...
    max_calls: int = 4096  # ...with at most this many calls
    server_gap_s: tuple[float, float] = (50e-6, 500e-6)
    seed: int = 0
    # Before the samples, the callables replayed interleaved for at least this long (ms,
    # host time), so every sample sees the clock state a sustained run settles into (a
    # large GEMM's: the power limit's); 0, none. Prefill run-offs set it (select.settle_ms).
    settle_ms: float = 0.0

    def as_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["server_gap_s"] = list(self.server_gap_s)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TimingConfig:
        d = dict(d)
        if "server_gap_s" in d:
            d["server_gap_s"] = tuple(d["server_gap_s"])
        return cls(**d)


class JobKind(enum.StrEnum):
    """What a runner is asked to do with a target."""

    MEASURE = "measure"  # a compiled kernel through the correctness suite, timed beside torch
    AUTOTUNE = "cublaslt"  # cuBLASLt autotuned; its fastest correct algorithm timed so
    PROFILE = "profile"  # Nsight Compute counters of one launch of a kernel
    SANITIZE = "sanitizer"  # compute-sanitizer memcheck of one launch at a small size


@dataclass(frozen=True)
class Job:
    """One unit of work for a runner (``cudal2.verify.runner``), typed and serialisable:
    it crosses the pipe to a measuring worker as JSON, and may cross hosts.

    Kernel jobs (every kind but ``cublaslt``) name the artifact (``artifact_key``), its
    ``symbol`` and launch ``recipe``, and where its ``cubin`` lies on the measuring host
    ("" for a runner that needs no cubins, as a replay). ``design`` is the design the
    artifact was rendered from (None for a hand-written fixture kernel). ``toolchain``
    and ``timing.mode`` complete the reuse key: a runner's answer to this job is what a
    record of ``reuse_key(gpu)`` stands for.

    ``profile_metrics``: the Nsight Compute quantities a ``profile`` job asks for (our
    names, the keys of ``verify.profile.METRICS``); empty: every one. Not part of the
    reuse key: the profile enriches the same record.

    ``rival``: a ``measure`` job of a run-off (``pipeline.runoff``) also times this
    cuBLASLt algorithm beside the kernel and torch, interleaved in the same process: the
    vendor record's ``vendor`` fields and its ``design_key``, which names the rival's
    baseline in the answer (``RIVAL_FIELDS``). Not part of the reuse key: the answer is
    a new record of the kernel's key, the newest, which stands for it.
    """

    kind: JobKind
    target: Target
    timing: TimingConfig
    toolchain: str
    design: KernelDesign | None = None
    artifact_key: str = ""
    symbol: str = ""
    recipe: dict[str, Any] = field(default_factory=dict)
    cubin: str = ""
    profile_metrics: tuple[str, ...] = ()
    rival: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", JobKind(self.kind))
        if self.kind != JobKind.AUTOTUNE and not (self.artifact_key and self.symbol):
            raise ValueError(f"a {self.kind} job needs an artifact key and a symbol")
        if self.rival:
            if self.kind != JobKind.MEASURE or self.target.epilogue != "none":
                raise ValueError(
                    f"a rival algorithm is timed beside a plain target's measure job only, "
                    f"not a {self.kind} job of {self.target.label}"
                )
            missing = [k for k in RIVAL_FIELDS if k not in self.rival]
            if missing or not str(self.rival["design_key"]).startswith("cublaslt:"):
                raise ValueError(
                    f"rival {self.rival.get('design_key')!r}: not a cuBLASLt record's "
                    f"algorithm (it needs {', '.join(RIVAL_FIELDS)}; missing {missing})"
                )

    def reuse_key(self, gpu: str) -> ReuseKey:
        """The key of the record this job's answer makes on GPU model ``gpu``."""
        key = ReuseKey(gpu, self.target.key, self.artifact_key, self.toolchain, self.timing.mode)
        return key.autotuned() if self.kind == JobKind.AUTOTUNE else key

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "target": self.target.as_json(),
            "timing": self.timing.as_json(),
            "toolchain": self.toolchain,
            "design": self.design.as_json() if self.design else None,
            "artifact_key": self.artifact_key,
            "symbol": self.symbol,
            "recipe": dict(self.recipe),
            "cubin": self.cubin,
            **({"profile_metrics": list(self.profile_metrics)} if self.profile_metrics else {}),
            **({"rival": dict(self.rival)} if self.rival else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Job:
        return cls(
            kind=JobKind(d["kind"]),
            target=Target.from_json(d["target"]),
            timing=TimingConfig.from_json(d["timing"]),
            toolchain=d["toolchain"],
            design=KernelDesign.from_json(d["design"]) if d.get("design") else None,
            artifact_key=d.get("artifact_key", ""),
            symbol=d.get("symbol", ""),
            recipe=dict(d.get("recipe") or {}),
            cubin=d.get("cubin", ""),
            profile_metrics=tuple(d.get("profile_metrics") or ()),
            rival=dict(d.get("rival") or {}),
        )


@dataclass(frozen=True)
class JobResult:
    """A runner's answer to one job, carrying the job (answers may come back in any
    order).

    ``status`` None is the typed "not recorded" answer: the runner has no result for
    the job (a replay runner whose database holds no record of its reuse key). The
    pipeline treats it as unmeasured: never a failure, never a time, nothing written.

    A ``measure`` or ``cublaslt`` answer carries the correctness errors, every timing
    sample of the candidate and of each baseline timed beside it, and ``metrics``
    measured with them (the vendor spread the error bound came from; a replayed answer
    carries the record's metrics); a ``cublaslt`` answer also the algorithm found
    (``vendor``, empty when the job failed before trying one). A ``profile`` answer
    carries the Nsight Compute counters in ``metrics``; a ``sanitizer`` answer is
    ``ok`` or ``sanitizer`` with the memcheck report in ``error``.
    """

    job: Job
    status: Status | None
    error: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    samples_us: tuple[float, ...] = ()
    baseline_samples_us: dict[str, tuple[float, ...]] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    vendor: dict[str, Any] = field(default_factory=dict)
    # The GPU that answered, where a runner measures on several (None: the runner's one
    # GPU, as ``start`` returned it).
    gpu: GpuInfo | None = None
    # The job's wall seconds on its worker (what the worker reports, else the round trip
    # the parent saw: the job sent to its answer read, ``verify/pool.py``) and the
    # worker's phases (module load, operands, correctness, pdl pair, timing capture,
    # timing replay): where a build's measure stage goes (``pipeline.stages``). They cross
    # the pipe with the answer and are never recorded (a record's ``metrics`` feed the
    # corpus); None / empty: no worker ran it (a replay), or a runner that does not say.
    job_s: float | None = None
    phases_s: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status is not None:
            object.__setattr__(self, "status", Status(self.status))

    @classmethod
    def not_recorded(cls, job: Job, why: str) -> JobResult:
        return cls(job, None, why)

    @property
    def recorded(self) -> bool:
        return self.status is not None

    def as_json(self) -> dict[str, Any]:
        return {
            "job": self.job.as_json(),
            "status": None if self.status is None else self.status.value,
            "error": self.error,
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "samples_us": list(self.samples_us),
            "baseline_samples_us": {k: list(v) for k, v in self.baseline_samples_us.items()},
            "metrics": dict(self.metrics),
            "vendor": dict(self.vendor),
            **({} if self.gpu is None else {"gpu": self.gpu.as_json()}),
            **({} if self.job_s is None else {"job_s": self.job_s}),
            **({"phases_s": dict(self.phases_s)} if self.phases_s else {}),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobResult:
        return cls(
            job=Job.from_json(d["job"]),
            status=None if d.get("status") is None else Status(d["status"]),
            error=d.get("error", ""),
            max_abs_err=d.get("max_abs_err"),
            max_rel_err=d.get("max_rel_err"),
            samples_us=tuple(d.get("samples_us", ())),
            baseline_samples_us={k: tuple(v) for k, v in d.get("baseline_samples_us", {}).items()},
            metrics=dict(d.get("metrics") or {}),
            vendor=dict(d.get("vendor") or {}),
            gpu=None if d.get("gpu") is None else GpuInfo.from_json(d["gpu"]),
            job_s=None if d.get("job_s") is None else float(d["job_s"]),
            phases_s=dict(d.get("phases_s") or {}),
        )
