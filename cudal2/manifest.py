"""The build manifest: TOML schema, validation and expansion to ``Target`` records.

The schema is documented key by key in ``manifests/README.md``. Every kind of bad
input raises ``ManifestError`` carrying the key path (``search.candidates``,
``targets[0].shapes[2][1]``) and the offending value, so the CLI can print one
line and exit 2.
"""

from __future__ import annotations

import hashlib
import math
import re
import reprlib
import stat
import tomllib
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from cudal2 import models
from cudal2.generator.families import FAMILIES
from cudal2.packaging.wheel import name_problem, package_name, wheel_version
from cudal2.policy import PROPOSERS
from cudal2.records import (
    ARCHS,
    DTYPES,
    EPILOGUE_ACTIVATION,
    EPILOGUES,
    LAYOUTS,
    ROPE_KV,
    Target,
    heads_problem,
)

TIMING_MODES: tuple[str, ...] = ("offline", "server")
# Where the jobs of a build are answered (docs/runners.md): worker processes on one
# local GPU, one per GPU of this host, or Ray actors across a cluster.
RUNNER_KINDS: tuple[str, ...] = ("local", "host", "ray")
# A CUDA device ordinal a [runner] may name: far above any host's GPU count.
MAX_DEVICE = 255

# The gemm_v1 ABI passes M, N, K as C ``int``.
MAX_DIM = 2**31 - 1
# A manifest expands to at most this many targets (each group's count, taken from its
# lists' lengths before anything is expanded, and all groups' together, duplicates
# included): far above any real build (the shipped ones have up to 96), far below
# what takes minutes or gigabytes to plan.
MAX_TARGETS = 10_000
# A manifest file is a page of TOML; anything larger is not one (and /dev/zero never ends).
MAX_MANIFEST_BYTES = 1 << 20
# The host time a kernel launch may save over a torch / cuBLASLt call, in us: a few us
# on an H100 (bench/results/h100-host-overhead.json); far above is not a host saving.
MAX_HOST_SAVING_US = 1000.0
# Search counts a GPU build could finish; the seed is what every seeded generator of
# the build (Python, torch) takes.
MAX_CANDIDATES = 4096
MAX_ROUNDS = 100
MAX_SEED = 2**32 - 1

_TOML_POS_RE = re.compile(r"\(at line (\d+), column (\d+)\)")

_TOP_KEYS = ("package", "build", "search", "timing", "runner", "targets", "grid", "model")
_PACKAGE_KEYS = ("name", "version")
_BUILD_KEYS = ("gpus", "dtypes", "layouts", "eager_host_saving_us", "reuse")
_SEARCH_KEYS = (
    "proposer",
    "candidates",
    "rounds",
    "gpu_budget_s",
    "seed",
    "profile_top",
    "profile_metrics",
    "profile_last_round",
    "profile_lag",
    "families",
    "cublaslt",
    "policy_updates",
    "pdl",
    "room",
    "trial",
    "knobs",
)
_TIMING_KEYS = ("mode",)
_RUNNER_KEYS = ("kind", "devices", "interchangeable", "ray_address", "job_timeout_s")
_OVERRIDE_KEYS = ("dtypes", "layouts")
_TARGETS_KEYS = ("shapes", "epilogue", "heads", *_OVERRIDE_KEYS)
_GRID_KEYS = ("m", "n", "k", *_OVERRIDE_KEYS)
_MODEL_KEYS = ("config", "tokens", "tp", "fused", "lm_head", "epilogues", *_OVERRIDE_KEYS)
# The fused epilogues a [[model]] may ask for a projection (every projection also gets
# its plain target), and the layout they are built for (sm90tma: tn only).
FUSED_EPILOGUES = tuple(e for e in EPILOGUES if e != "none")
EPILOGUE_LAYOUTS = ("tn",)

# Which Nsight Compute quantities a build collects (``verify.profile.quantities``): the
# ones the search reads, or every one the profiler knows.
PROFILE_METRICS = ("search", "all")

_MISSING = object()


class ManifestError(Exception):
    """A manifest that cannot be built, with where and what.

    ``key_path`` is the dotted/indexed path of the offending key (empty for the
    file as a whole), ``value`` the offending value; ``str(e)`` is one line that
    names the file, the key path, the value and what is wrong.
    """

    def __init__(self, message: str, key_path: str = "", value: Any = None) -> None:
        super().__init__(" ".join(message.split()))
        self.key_path = key_path
        self.value = value


# Values are quoted in messages, bounded: a 1000-element list or a table nested 5000
# deep is shown by its start (plain repr() of the latter raises RecursionError).
_shown = reprlib.Repr()
_shown.maxlevel, _shown.maxlist, _shown.maxdict = 3, 8, 8
_shown.maxstring, _shown.maxother, _shown.maxlong = 120, 120, 60


def shown(value: Any) -> str:
    """``repr(value)``, shortened for a one-line message."""
    return _shown.repr(value)


@dataclass(frozen=True)
class SearchSettings:
    """How kernels are searched for: proposer, designs per target per round, rounds,
    GPU-time budget of one build in seconds, the random seed, how many of each
    target's fastest candidates per round get Nsight Compute metrics (0: none), the
    families searched, whether cuBLASLt is autotuned per target as one more
    candidate, whether the policy's weights are updated between rounds, whether
    each proposed tile is followed by its PDL variants (within ``candidates``), and
    whether designs that leave room for the next kernel are searched (with PDL only),
    and whether the families' trial designs are (written, not yet measured on a GPU).

    ``profile_metrics``: which Nsight Compute quantities are collected, ``search`` (what
    the proposers read, ``verify.profile.SEARCH_QUANTITIES``: fewer replay passes) or
    ``all``; ``profile_last_round``: whether every round is profiled, also those whose
    profiles no proposal reads (by default they are not). ``profile_lag``: 0, round r's
    profiles are read by round r+1's proposals (ncu runs between the rounds); 1, by round
    r+2's, and round r's ncu run overlaps round r+1's proposing and compiling
    (``profiled``, ``pipeline.build``)."""

    proposer: str = "policy"
    candidates: int = 8
    rounds: int = 1
    gpu_budget_s: float = 1800.0
    seed: int = 0
    profile_top: int = 2
    profile_metrics: str = "search"  # one of PROFILE_METRICS
    profile_last_round: bool = False
    profile_lag: int = 0  # 0 or 1: rounds between a round and the proposals its profiles feed
    families: tuple[str, ...] | None = None  # kernel families searched (None: all)
    cublaslt: bool = True  # autotune cuBLASLt per target; its algorithm may be dispatched
    policy_updates: bool = True  # online GRPO between rounds (proposer "policy" only)
    pdl: bool = False  # each proposed tile followed by its PDL variants (policy/pdl.py)
    room: bool = False  # room designs in the space, measured with PDL (policy/room.py)
    # the families' trial designs in the space too (written, not yet measured on a GPU:
    # generator.families.base.family_trial); a sweep's way to measure them
    trial: bool = False
    # Only designs whose knobs take these values ((name, values) pairs; a family's
    # optional knob left out of a design counts as its default; a family without the
    # knob is not searched). None: no restriction. A sweep's way to measure chosen knobs.
    knobs: tuple[tuple[str, tuple[int, ...]], ...] | None = None

    def profiled(self, rnd: int) -> bool:
        """Whether round ``rnd`` (counted from 0) is profiled: a later round's proposals
        read its profiles (round ``rnd + 1 + profile_lag``), or ``profile_last_round``
        asks for every round. (``profile_top`` 0 profiles nothing either way.)"""
        return self.profile_last_round or rnd + 1 + self.profile_lag < self.rounds


@dataclass(frozen=True)
class RunnerSettings:
    """Where the build's jobs are answered (``[runner]``; ``cudal2-build --runner`` and
    ``--ray-address`` override ``kind`` and ``ray_address``): ``kind`` "local" (worker
    processes on one GPU, ``--device``), "host" (one per GPU of this host: ``devices``,
    CUDA device ordinals, default every visible GPU) or "ray" (an actor per GPU of a Ray
    cluster at ``ray_address``, default a local head); ``interchangeable``: groups of GPU
    model names whose measurements may stand for one another (host, ray); a job with
    no answer within ``job_timeout_s`` is a hang."""

    kind: str = "local"
    devices: tuple[int, ...] | None = None
    interchangeable: tuple[tuple[str, ...], ...] = ()
    ray_address: str | None = None
    job_timeout_s: float = 180.0


@dataclass(frozen=True)
class Manifest:
    """A validated manifest, expanded to its deduplicated, sorted targets.

    ``archs``/``dtypes``/``layouts`` are the ``[build]`` defaults; a target group
    may override dtypes and layouts, so read ``targets`` for what is built.
    ``sha256`` is the hash of the manifest file's bytes.
    """

    path: Path
    sha256: str
    name: str
    version: str
    archs: tuple[str, ...]
    dtypes: tuple[str, ...]
    layouts: tuple[str, ...]
    search: SearchSettings
    timing_mode: str
    targets: tuple[Target, ...]
    # [build] eager_host_saving_us: 0 = no eager alternatives (pipeline.select)
    eager_host_saving_us: float = 0.0
    runner: RunnerSettings = RunnerSettings()
    # [build] reuse: other measurement databases (absolute paths) whose records the build
    # reads beside its own, never writing to them (cudal2.database.MeasurementDB)
    reuse: tuple[Path, ...] = ()

    @property
    def package(self) -> str:
        """The import name of the generated wheel."""
        return package_name(self.name)


def default_manifest_path() -> Path:
    """The shipped ``manifests/default.toml``."""
    return Path(str(files("cudal2.manifests") / "default.toml"))


class _Reader:
    """Validates one parsed manifest; every error names the file, key path and value."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key_path: str, value: Any, problem: str) -> ManifestError:
        quoted = "" if value is _MISSING else f" = {shown(value)}"
        return ManifestError(
            f"{self.path}: {key_path}{quoted}: {problem}",
            key_path,
            None if value is _MISSING else value,
        )

    # -- tables -----------------------------------------------------------------

    def table(self, value: Any, key_path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key_path, value, f"must be a table [{key_path}]")
        for key in value:
            if key not in allowed:
                where = f"[{key_path}]" if key_path else "the top level"
                raise self.fail(
                    f"{key_path}.{key}" if key_path else key,
                    value[key],
                    f"unknown key; allowed in {where}: {', '.join(allowed)}",
                )
        return value

    def array_of_tables(
        self, doc: dict[str, Any], key: str, allowed: tuple[str, ...]
    ) -> list[dict[str, Any]]:
        value = doc.get(key, [])
        if not isinstance(value, list):
            raise self.fail(key, value, f"must be an array of tables, written [[{key}]]")
        return [self.table(item, f"{key}[{i}]", allowed) for i, item in enumerate(value)]

    def required(self, table: dict[str, Any], key: str, key_path: str) -> Any:
        if key not in table:
            raise self.fail(key_path, _MISSING, "missing required key")
        return table[key]

    # -- scalars ------------------------------------------------------------------

    def integer(self, value: Any, key_path: str, minimum: int, maximum: int | None = None) -> int:
        # bool is an int subclass in Python, but `true` is never a count.
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key_path, value, "must be an integer")
        if value < minimum:
            bound = "positive" if minimum == 1 else f">= {minimum}"
            raise self.fail(key_path, value, f"must be {bound}")
        if maximum is not None and value > maximum:
            raise self.fail(key_path, value, f"must be at most {maximum}")
        return value

    def dim(self, value: Any, key_path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
            raise self.fail(key_path, value, f"a dimension must be an integer in [1, {MAX_DIM}]")
        return value

    def positive_number(self, value: Any, key_path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key_path, value, "must be a number")
        if not math.isfinite(value) or value <= 0:
            raise self.fail(key_path, value, "must be a positive finite number")
        return float(value)

    def string(self, value: Any, key_path: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key_path, value, "must be a string")
        return value

    def choice(self, value: Any, key_path: str, supported: tuple[str, ...]) -> str:
        if self.string(value, key_path) not in supported:
            raise self.fail(key_path, value, f"unsupported; supported: {', '.join(supported)}")
        return value

    def boolean(self, value: Any, key_path: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key_path, value, "must be true or false")
        return value

    # -- lists ----------------------------------------------------------------------

    def nonempty_list(self, value: Any, key_path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(key_path, value, "must be a list")
        if not value:
            raise self.fail(key_path, value, "must not be empty")
        return value

    def choices(self, value: Any, key_path: str, supported: tuple[str, ...]) -> tuple[str, ...]:
        items = self.nonempty_list(value, key_path)
        picked = [self.choice(v, f"{key_path}[{i}]", supported) for i, v in enumerate(items)]
        return tuple(dict.fromkeys(picked))  # drop repeats, keep the user's order

    def dims(self, value: Any, key_path: str) -> list[int]:
        items = self.nonempty_list(value, key_path)
        return [self.dim(v, f"{key_path}[{i}]") for i, v in enumerate(items)]

    def shape(self, value: Any, key_path: str) -> tuple[int, int, int]:
        if not isinstance(value, list) or len(value) != 3:
            raise self.fail(key_path, value, "a shape must be a list of 3 integers [M, N, K]")
        m, n, k = (self.dim(v, f"{key_path}[{i}]") for i, v in enumerate(value))
        return m, n, k


def _reuse(r: _Reader, value: Any) -> tuple[Path, ...]:
    """``[build] reuse``: measurement databases, each a path relative to the manifest's
    folder (or absolute) of an existing regular file, each file named once."""
    items = r.nonempty_list(value, "build.reuse")
    out: dict[tuple[int, int], Path] = {}
    for i, v in enumerate(items):
        kp = f"build.reuse[{i}]"
        if not r.string(v, kp).strip():
            raise r.fail(kp, v, "must be the path of a measurement database")
        path = r.path.parent / v
        try:
            info = path.stat()
        except OSError as e:
            raise r.fail(kp, v, f"cannot read {path}: {e.strerror or e}") from None
        if not stat.S_ISREG(info.st_mode):
            raise r.fail(kp, v, f"{path} is not a regular file (a measurement database)")
        if (info.st_dev, info.st_ino) in out:
            raise r.fail(kp, v, "names a database already listed")
        out[(info.st_dev, info.st_ino)] = path
    return tuple(out.values())


def _runner(r: _Reader, doc: dict[str, Any]) -> RunnerSettings:
    """``[runner]``: each key checked for its kind, and the keys of another kind refused
    (a ``ray_address`` in a host build is a mistake, not a hint)."""
    t = r.table(doc.get("runner", {}), "runner", _RUNNER_KEYS)
    d = RunnerSettings()
    kind = r.choice(t.get("kind", d.kind), "runner.kind", RUNNER_KINDS)
    for key, kinds in (("devices", ("host",)), ("interchangeable", ("host", "ray"))):
        if key in t and kind not in kinds:
            raise r.fail(
                f"runner.{key}", t[key], f"only with kind = {' or '.join(map(repr, kinds))} "
                f"(kind here: {kind!r})",
            )  # fmt: skip
    if "ray_address" in t and kind != "ray":
        raise r.fail(
            "runner.ray_address", t["ray_address"], f"only with kind = 'ray' (kind here: {kind!r})"
        )
    devices = None
    if "devices" in t:
        items = r.nonempty_list(t["devices"], "runner.devices")
        devices = tuple(
            r.integer(v, f"runner.devices[{i}]", 0, MAX_DEVICE) for i, v in enumerate(items)
        )
        for i, v in enumerate(devices):
            if v in devices[:i]:
                raise r.fail(f"runner.devices[{i}]", v, "named twice")
    groups: list[tuple[str, ...]] = []
    if "interchangeable" in t:
        value = t["interchangeable"]
        items = r.nonempty_list(value, "runner.interchangeable")
        for i, group in enumerate(items):
            kp = f"runner.interchangeable[{i}]"
            if not isinstance(group, list) or len(group) < 2:
                raise r.fail(kp, group, "must be a list of at least two GPU model names")
            names = [r.string(x, f"{kp}[{j}]") for j, x in enumerate(group)]
            for j, name in enumerate(names):
                if not name.strip():
                    raise r.fail(f"{kp}[{j}]", name, "a GPU model name must not be empty")
            groups.append(tuple(dict.fromkeys(names)))
    address = None
    if "ray_address" in t:
        address = r.string(t["ray_address"], "runner.ray_address")
        if not address.strip():
            raise r.fail(
                "runner.ray_address",
                address,
                "must not be empty (leave it out for a local Ray head)",
            )
    timeout = r.positive_number(t.get("job_timeout_s", d.job_timeout_s), "runner.job_timeout_s")
    return RunnerSettings(kind, devices, tuple(groups), address, timeout)


def _read(path: Path) -> bytes:
    """The manifest file's bytes: a regular file of at most ``MAX_MANIFEST_BYTES``."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ManifestError(f"{path}: cannot read manifest: not a regular file", "", str(path))
        if info.st_size > MAX_MANIFEST_BYTES:
            raise ManifestError(
                f"{path}: cannot read manifest: {info.st_size} bytes, more than a manifest "
                f"may have ({MAX_MANIFEST_BYTES})",
                "",
                str(path),
            )
        with path.open("rb") as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)  # a file that grew since stat() is cut
    except OSError as e:
        raise ManifestError(
            f"{path}: cannot read manifest: {e.strerror or e}", "", str(path)
        ) from e
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"{path}: cannot read manifest: more than {MAX_MANIFEST_BYTES} bytes", "", str(path)
        )
    return data


def _parse_toml(path: Path, data: bytes) -> dict[str, Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ManifestError(f"{path}: not UTF-8 text: {e}", "", None) from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # tomllib (3.11) puts "(at line L, column C)" in its message; quote that line too.
        msg = str(e)
        line_text = None
        pos = _TOML_POS_RE.search(msg)
        if pos:
            lines = text.splitlines()
            lineno = int(pos.group(1))
            if 1 <= lineno <= len(lines):
                line_text = lines[lineno - 1].strip()
        quoted = f": {shown(line_text)}" if line_text else ""
        raise ManifestError(f"{path}: TOML syntax error: {msg}{quoted}", "", line_text) from e
    except RecursionError as e:
        raise ManifestError(f"{path}: TOML syntax error: arrays or tables nested too deeply") from e
    except ValueError as e:  # an integer literal of more than 4300 digits
        raise ManifestError(f"{path}: TOML syntax error: {e}") from e


def _config_path(r: _Reader, config: str, key_path: str, manifest_dir: Path) -> Path:
    """The model config file a ``[[model]]`` names: relative to the manifest, not the
    working directory, so a manifest builds the same from wherever the CLI runs."""
    try:
        path = models.resolve_config_path((manifest_dir / Path(config).expanduser()).resolve())
        if not path.exists():
            raise r.fail(key_path, str(path), "model config file not found")
        if not path.is_file():
            raise r.fail(key_path, str(path), "model config is not a regular file")
    except (OSError, RuntimeError, ValueError) as e:
        # a NUL byte, a name too long, a symlink loop, ~user of no such user
        raise r.fail(key_path, config, f"not a usable path: {e}") from e
    return path


def _expand_model(
    r: _Reader, entry: dict[str, Any], key_path: str, manifest_dir: Path
) -> list[tuple[int, int, int, str, tuple[int, ...]]]:
    config_key = f"{key_path}.config"
    config = r.string(r.required(entry, "config", config_key), config_key)
    tokens = r.dims(r.required(entry, "tokens", f"{key_path}.tokens"), f"{key_path}.tokens")
    tp = r.integer(entry.get("tp", 1), f"{key_path}.tp", 1)
    fused = r.boolean(entry.get("fused", True), f"{key_path}.fused")
    lm_head = r.boolean(entry.get("lm_head", False), f"{key_path}.lm_head")

    config_path = _config_path(r, config, config_key, manifest_dir)
    try:
        projections = models.projection_shapes(config_path, tp, fused, lm_head)
    except models.TensorParallelError as e:
        raise r.fail(f"{key_path}.tp", tp, str(e)) from e
    except models.ModelConfigError as e:
        raise r.fail(config_key, config, str(e)) from e
    # A config is data too: its sizes must make GEMMs the kernel ABI can take.
    for proj, n, k in projections:
        for dim, value in (("N", n), ("K", k)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIM:
                raise r.fail(
                    config_key,
                    config,
                    f"projection {proj!r} gives {dim} = {shown(value)}: a dimension must be "
                    f"an integer in [1, {MAX_DIM}]",
                )
    fused = _model_epilogues(
        r, entry, key_path, {proj: n for proj, n, _ in projections}, config_path, lm_head
    )
    # a rope_kv epilogue's target carries the qkv projection's head split on one rank
    heads = models.qkv_heads(config_path, tp) if "qkv" in fused else ()
    return [
        (m, n, k, epilogue, heads if epilogue in ROPE_KV else ())
        for m in tokens
        for proj, n, k in projections
        for epilogue in ("none", *fused.get(proj, ()))
    ]


def _model_epilogues(
    r: _Reader,
    entry: dict[str, Any],
    key_path: str,
    projections: dict[str, int],
    config_path: Path,
    lm_head: bool,
) -> dict[str, tuple[str, ...]]:
    """``epilogues = { qkv = ["rmsnorm"], gate_up = ["rmsnorm_silu"], o = ["residual"],
    down = ["residual"] }``: per projection of this model (``projections``: name -> N on
    one rank), the fused epilogues its linears need (each a target of its own beside
    the plain one). A gated epilogue (``silu``, ``rmsnorm_gelu_tanh``, ...) needs an
    even N: its weight is gate and up rows packed in pairs. ``epilogues = "auto"`` (a
    ``fused = true`` model): those a wheel's ``patch_model`` runs for this architecture
    (``models.patch_epilogues``: the runtime's family table), the LM head's with
    ``lm_head = true``."""
    kp = f"{key_path}.epilogues"
    value = entry.get("epilogues", {})
    if value == "auto":
        if "qkv" not in projections:  # fused = false: q, k, v, gate, up as transformers has
            raise r.fail(
                kp, value, "needs fused = true (the projections patch_model runs: qkv, o, "
                "gate_up, down)",
            )  # fmt: skip
        try:
            auto = models.patch_epilogues(config_path, lm_head)
        except models.ModelConfigError as e:
            raise r.fail(kp, value, str(e)) from e
        value = {proj: list(names) for proj, names in auto.items()}
    if not isinstance(value, dict):
        raise r.fail(kp, value, 'must be a table of projection = [epilogues], or "auto"')
    out = {}
    for proj, names in value.items():
        if proj not in projections:
            raise r.fail(
                f"{kp}.{proj}", names, f"not a projection of this model (its projections: "
                f"{list(projections)})",
            )  # fmt: skip
        out[proj] = r.choices(names, f"{kp}.{proj}", FUSED_EPILOGUES)
        n = projections[proj]
        for i, name in enumerate(names):
            if name in ROPE_KV and proj != "qkv":
                raise r.fail(
                    f"{kp}.{proj}[{i}]", name, "a rope_kv epilogue (RoPE and the KV-cache "
                    "write) is the fused qkv projection's alone (fused = true)",
                )  # fmt: skip
            if name in EPILOGUE_ACTIVATION and n % 2:
                raise r.fail(
                    f"{kp}.{proj}[{i}]", name, f"a gated epilogue needs an even N (gate and "
                    f"up rows packed in pairs): projection {proj!r} has N = {n} here",
                )  # fmt: skip
    return out


def _targets_epilogue(
    r: _Reader, entry: dict[str, Any], key_path: str
) -> tuple[str, tuple[int, ...]]:
    """A ``[[targets]]`` group's fused epilogue (``epilogue``, default none: every shape
    of the group gets it) and head split (``heads = [q_heads, kv_heads, head_dim]``, the
    rope_kv epilogues' and theirs alone)."""
    epilogue = "none"
    if "epilogue" in entry:
        epilogue = r.choice(entry["epilogue"], f"{key_path}.epilogue", FUSED_EPILOGUES)
    heads: tuple[int, ...] = ()
    if "heads" in entry:
        value = entry["heads"]
        if not isinstance(value, list) or len(value) != 3:
            raise r.fail(f"{key_path}.heads", value, "must be [q_heads, kv_heads, head_dim]")
        heads = tuple(r.integer(v, f"{key_path}.heads[{i}]", 1) for i, v in enumerate(value))
    return epilogue, heads


def _group_overrides(
    r: _Reader,
    entry: dict[str, Any],
    key_path: str,
    dtypes: tuple[str, ...],
    layouts: tuple[str, ...],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if "dtypes" in entry:
        dtypes = r.choices(entry["dtypes"], f"{key_path}.dtypes", DTYPES)
    if "layouts" in entry:
        layouts = r.choices(entry["layouts"], f"{key_path}.layouts", LAYOUTS)
    return dtypes, layouts


class _Budget:
    """The targets' bound, checked from each group's lists' lengths before the group is
    expanded, so a grid of 1000 values per axis is an error in microseconds."""

    def __init__(self, r: _Reader, archs: tuple[str, ...]) -> None:
        self.r = r
        self.archs = len(archs)
        self.total = 0

    def take(self, key_path: str, shapes: int, dtypes: int, layouts: int, what: str) -> None:
        count = shapes * dtypes * layouts * self.archs
        if count > MAX_TARGETS:
            raise self.r.fail(
                key_path,
                count,
                f"expands to {what} x {dtypes} dtypes x {layouts} layouts x {self.archs} "
                f"archs = {count} targets; a manifest may have at most {MAX_TARGETS}",
            )
        self.total += count
        if self.total > MAX_TARGETS:
            raise self.r.fail(
                key_path,
                self.total,
                f"the groups up to this one expand to {self.total} targets (duplicates "
                f"counted); a manifest may have at most {MAX_TARGETS}",
            )


def _knobs(r: _Reader, value: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``search.knobs``: a table of knob name -> a non-empty list of values, each name a
    knob of some family (required or optional) and each value in its domain there."""
    from cudal2.generator.families.base import SHARED_KNOBS, family_optional

    if not isinstance(value, dict) or not value:
        raise r.fail("search.knobs", value, "must be a non-empty table of knob = [values]")
    domains: dict[str, set[int]] = {}
    for fam in FAMILIES.values():
        for k in (*fam.KNOBS, *family_optional(fam), *SHARED_KNOBS):
            domains.setdefault(k.name, set()).update(k.domain)
    out = []
    for name, values in value.items():
        path = f"search.knobs.{name}"
        if name not in domains:
            raise r.fail(path, values, f"{name!r} is not a knob of any family")
        got = tuple(r.integer(v, path, min(domains[name])) for v in r.nonempty_list(values, path))
        bad = [v for v in got if v not in domains[name]]
        if bad:
            raise r.fail(path, values, f"{bad} not among the knob's values {sorted(domains[name])}")
        out.append((name, got))
    return tuple(out)


def load_manifest(path: str | Path) -> Manifest:
    """Read, validate and expand a manifest file; raises ``ManifestError`` on any bad input."""
    try:
        path = Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, no such ~user
        raise ManifestError(f"{path}: cannot read manifest: {e}", "", str(path)) from e
    data = _read(path)
    doc = _parse_toml(path, data)
    r = _Reader(path)
    r.table(doc, "", _TOP_KEYS)

    if "package" not in doc:
        raise r.fail("package", _MISSING, "missing required table [package]")
    package = r.table(doc["package"], "package", _PACKAGE_KEYS)
    name = r.string(r.required(package, "name", "package.name"), "package.name")
    problem = name_problem(name)  # the wheel writer's own rule
    if problem:
        raise r.fail("package.name", name, problem)
    raw_version = r.string(r.required(package, "version", "package.version"), "package.version")
    try:
        version = wheel_version(raw_version)  # PEP 440, normalised as the wheel is named
    except ValueError as e:
        raise r.fail("package.version", raw_version, str(e)) from None

    build = r.table(doc.get("build", {}), "build", _BUILD_KEYS)
    archs = r.choices(build.get("gpus", ["sm_90a"]), "build.gpus", ARCHS)
    dtypes = r.choices(build.get("dtypes", ["fp16"]), "build.dtypes", DTYPES)
    layouts = r.choices(build.get("layouts", ["tn"]), "build.layouts", LAYOUTS)
    host_saving = build.get("eager_host_saving_us", 0.0)
    if isinstance(host_saving, bool) or not isinstance(host_saving, int | float):
        raise r.fail("build.eager_host_saving_us", host_saving, "must be a number")
    if not 0 <= host_saving <= MAX_HOST_SAVING_US:  # NaN fails both comparisons
        raise r.fail(
            "build.eager_host_saving_us",
            host_saving,
            f"must be a number of microseconds from 0 to {MAX_HOST_SAVING_US:g}",
        )

    reuse = _reuse(r, build["reuse"]) if "reuse" in build else ()

    s = r.table(doc.get("search", {}), "search", _SEARCH_KEYS)
    d = SearchSettings()
    search = SearchSettings(
        proposer=r.choice(s.get("proposer", d.proposer), "search.proposer", PROPOSERS),
        candidates=r.integer(
            s.get("candidates", d.candidates), "search.candidates", 1, MAX_CANDIDATES
        ),
        rounds=r.integer(s.get("rounds", d.rounds), "search.rounds", 1, MAX_ROUNDS),
        gpu_budget_s=r.positive_number(
            s.get("gpu_budget_s", d.gpu_budget_s), "search.gpu_budget_s"
        ),
        seed=r.integer(s.get("seed", d.seed), "search.seed", 0, MAX_SEED),
        profile_top=r.integer(
            s.get("profile_top", d.profile_top), "search.profile_top", 0, MAX_CANDIDATES
        ),
        profile_metrics=r.choice(
            s.get("profile_metrics", d.profile_metrics), "search.profile_metrics", PROFILE_METRICS
        ),
        profile_last_round=r.boolean(
            s.get("profile_last_round", d.profile_last_round), "search.profile_last_round"
        ),
        profile_lag=r.integer(s.get("profile_lag", d.profile_lag), "search.profile_lag", 0, 1),
        families=(
            r.choices(s["families"], "search.families", tuple(sorted(FAMILIES)))
            if "families" in s
            else None
        ),
        cublaslt=r.boolean(s.get("cublaslt", d.cublaslt), "search.cublaslt"),
        policy_updates=r.boolean(
            s.get("policy_updates", d.policy_updates), "search.policy_updates"
        ),
        pdl=r.boolean(s.get("pdl", d.pdl), "search.pdl"),
        knobs=_knobs(r, s["knobs"]) if "knobs" in s else None,
        room=r.boolean(s.get("room", d.room), "search.room"),
        trial=r.boolean(s.get("trial", d.trial), "search.trial"),
    )
    if search.room and not search.pdl:
        # a plain launch waits for the whole previous grid: room is only worth measuring
        # with PDL, and the search measures it only so (policy/room.py)
        raise r.fail(
            "search.room",
            True,
            "room designs are measured only with PDL launches: set search.pdl = true too",
        )
    if search.trial and search.room:
        # the room space is built over the legal space (policy/room.py), the trial space
        # beside it: a build searches one of them
        raise r.fail(
            "search.trial",
            True,
            "trial designs are searched without room designs: set search.room = false",
        )

    timing = r.table(doc.get("timing", {}), "timing", _TIMING_KEYS)
    timing_mode = r.choice(timing.get("mode", "offline"), "timing.mode", TIMING_MODES)
    runner = _runner(r, doc)

    # Each group yields (shapes, dtypes, layouts); the product with archs is taken once
    # below, after every group's count has passed the budget.
    budget = _Budget(r, archs)
    # shapes are (m, n, k, epilogue, heads): a [[model]]'s may carry a fused epilogue (and
    # a rope_kv one the qkv projection's head split)
    Shape = tuple[int, int, int, str, tuple[int, ...]]
    groups: list[tuple[list[Shape], tuple[str, ...], tuple[str, ...]]] = []
    for i, entry in enumerate(r.array_of_tables(doc, "targets", _TARGETS_KEYS)):
        kp = f"targets[{i}]"
        shapes_value = r.nonempty_list(r.required(entry, "shapes", f"{kp}.shapes"), f"{kp}.shapes")
        group_dtypes, group_layouts = _group_overrides(r, entry, kp, dtypes, layouts)
        n = len(shapes_value)
        budget.take(kp, n, len(group_dtypes), len(group_layouts), f"{n} shapes")
        epilogue, heads = _targets_epilogue(r, entry, kp)
        shapes = [
            (*r.shape(v, f"{kp}.shapes[{j}]"), epilogue, heads) for j, v in enumerate(shapes_value)
        ]
        for j, (m, n, k, _, _) in enumerate(shapes):
            problem = heads_problem(epilogue, n, heads)
            if problem:
                raise r.fail(
                    f"{kp}.heads", entry.get("heads"), f"shapes[{j}] {[m, n, k]}: {problem}"
                )
            if epilogue in EPILOGUE_ACTIVATION and n % 2:
                raise r.fail(
                    f"{kp}.shapes[{j}]", [m, n, k], "a gated epilogue needs an even N (gate and "
                    "up rows packed in pairs)",
                )  # fmt: skip
        groups.append((shapes, group_dtypes, group_layouts))
    for i, entry in enumerate(r.array_of_tables(doc, "grid", _GRID_KEYS)):
        kp = f"grid[{i}]"
        ms, ns, ks = (r.dims(r.required(entry, a, f"{kp}.{a}"), f"{kp}.{a}") for a in "mnk")
        group_dtypes, group_layouts = _group_overrides(r, entry, kp, dtypes, layouts)
        what = f"{len(ms)} x {len(ns)} x {len(ks)} shapes"
        budget.take(kp, len(ms) * len(ns) * len(ks), len(group_dtypes), len(group_layouts), what)
        shapes = [(m, n, k, "none", ()) for m in ms for n in ns for k in ks]
        groups.append((shapes, group_dtypes, group_layouts))
    for i, entry in enumerate(r.array_of_tables(doc, "model", _MODEL_KEYS)):
        kp = f"model[{i}]"
        # Overrides first: a typo there is cheaper to report than loading the config.
        group_dtypes, group_layouts = _group_overrides(r, entry, kp, dtypes, layouts)
        shapes = _expand_model(r, entry, kp, path.parent)
        n = len(shapes)
        budget.take(kp, n, len(group_dtypes), len(group_layouts), f"{n} shapes")
        groups.append((shapes, group_dtypes, group_layouts))

    targets = sorted(
        {
            Target(arch=arch, dtype=dt, layout=lay, m=m, n=n, k=k, epilogue=epilogue, heads=heads)
            for shapes, group_dtypes, group_layouts in groups
            for arch in archs
            for dt in group_dtypes
            for lay in group_layouts
            for m, n, k, epilogue, heads in shapes
            # a fused epilogue only where a family renders it (layout tn)
            if epilogue == "none" or lay in EPILOGUE_LAYOUTS
        }
    )
    if not targets:
        raise r.fail(
            "targets", _MISSING, "no targets: add at least one [[targets]], [[grid]] or [[model]]"
        )

    return Manifest(
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        name=name,
        version=version,
        archs=archs,
        dtypes=dtypes,
        layouts=layouts,
        search=search,
        timing_mode=timing_mode,
        targets=tuple(targets),
        eager_host_saving_us=float(host_saving),
        runner=runner,
        reuse=reuse,
    )


__all__ = [
    "MAX_CANDIDATES",
    "MAX_DIM",
    "MAX_MANIFEST_BYTES",
    "MAX_ROUNDS",
    "MAX_SEED",
    "MAX_TARGETS",
    "PROPOSERS",
    "RUNNER_KINDS",
    "TIMING_MODES",
    "Manifest",
    "ManifestError",
    "RunnerSettings",
    "SearchSettings",
    "default_manifest_path",
    "load_manifest",
]
