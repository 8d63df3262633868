"""Fixtures of the fault-injection suite (issue 17), named by class so the classes'
fixtures never collide: ``mf_*`` hostile manifests, ``rt_*`` the runtime and its table.

``rt_package`` is the recorded table (real H100 measurements, real cubins; the session
fixture of ``tests/conftest.py``) written by the real wheel writer, laid out as pip
installs a wheel, and imported: the package a user's process has.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

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
