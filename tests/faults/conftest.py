"""Fixtures of the fault-injection suite (issue 17), named by class so the classes'
fixtures never collide: ``mf_*`` hostile manifests, ``rt_*`` the runtime and its table,
``cache_*`` the cache, kill and diff cases.

``rt_package`` is the recorded table (real H100 measurements, real cubins; the session
fixture of ``tests/conftest.py``) written by the real wheel writer, laid out as pip
installs a wheel, and imported: the package a user's process has. ``cache_clean`` is one
clean build of the default manifest from its committed H100 database, shared by the
session.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import shutil
import sys
import uuid
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from cudal2.cli import build as build_cli
from cudal2.manifest import default_manifest_path
from cudal2.packaging.wheel import package_name, write_wheel


def _install(root: Path, table, cubins: dict[str, bytes]) -> str:
    tag = uuid.uuid4().hex[:12]
    table = dataclasses.replace(table, name=f"f{tag}", package=package_name(f"f{tag}"))
    wheel = write_wheel(table, cubins, root / "dist")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root / "site")
    return table.package


@pytest.fixture(scope="module")
def rt_package(_best_kernel_table, tmp_path_factory) -> Iterator[ModuleType]:
    """The recorded table as an imported generated package, one per test module (a
    module that tampers with its files tampers with its own copy)."""
    table, cubins = _best_kernel_table
    root = tmp_path_factory.mktemp("rt-package")
    name = _install(root, table, cubins)
    sys.path.insert(0, str(root / "site"))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(root / "site"))
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


@pytest.fixture(scope="module")
def rt_table(_best_kernel_table):
    """The recorded table (``DispatchTable``) the package was written from."""
    return _best_kernel_table[0]


@dataclass(frozen=True)
class CacheCleanBuild:
    """A clean build's cache, wheel and the cubins of its kernel entries."""

    cache: Path
    wheel: Path
    wheel_sha256: str
    cubins: dict[str, bytes]  # artifact key -> the clean compile's cubin

    @property
    def keys(self) -> list[str]:
        return sorted(self.cubins)


def cache_build_args(cache: Path, out: Path) -> list[str]:
    """``cudal2-build``'s arguments for the default manifest, replaying its recorded
    database (``--no-measure``: the same on a machine with a GPU)."""
    return [
        str(default_manifest_path()),
        "--no-measure",
        "--cache",
        str(cache),
        "--out",
        str(out),
        "--jobs",
        "2",
    ]


def cache_file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def cache_clean(tmp_path_factory) -> CacheCleanBuild:
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    root = tmp_path_factory.mktemp("clean")
    cache, out = root / "cache", root / "out"
    assert build_cli.main(cache_build_args(cache, out)) == 0
    (wheel,) = out.glob("*.whl")
    cubins = {}
    for build_json in cache.glob("??/*/build.json"):
        record = json.loads(build_json.read_text())
        assert record["ok"], record
        cubins[record["artifact_key"]] = (build_json.parent / "kernel.cubin").read_bytes()
    assert len(cubins) == 2, "the default manifest ships two kernels"
    return CacheCleanBuild(cache, wheel, cache_file_sha256(wheel), cubins)


@pytest.fixture(scope="session")
def cache_fake_nvcc(tmp_path_factory) -> Path:
    """A folder holding an ``nvcc`` that answers ``--version`` as the real one (so the
    artifact keys are the real ones) and otherwise records its pid, its parent's (the
    guard) and its child's in ``$CUDAL2_FAKE_NVCC_PIDS`` and sleeps in that child: a
    compile that lasts until it is killed, with a grandchild as nvcc's cicc would be."""
    real = shutil.which("nvcc")
    if real is None:
        pytest.skip("needs nvcc")
    d = tmp_path_factory.mktemp("fake-nvcc")
    fake = d / "nvcc"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--version" ]; then exec "{real}" --version; fi\n'
        "sleep 120 &\n"
        'echo "$$ $PPID $!" >> "$CUDAL2_FAKE_NVCC_PIDS"\n'
        "wait\n"
    )
    fake.chmod(0o755)
    return d
