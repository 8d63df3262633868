"""The kernel wheel: reproducible bytes, layout, metadata, RECORD, installability."""

from __future__ import annotations

import ast
import base64
import csv
import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheel.wheelfile import WheelFile

import cudal2.packaging.runtime
from cudal2.generator.scratch import owned_name
from cudal2.manifest import default_manifest_path, load_manifest
from cudal2.packaging.runtime.table import DispatchTable, TableEntry
from cudal2.packaging.table import read_table
from cudal2.packaging.wheel import (
    CUBLASLT_REQUIRES,
    RUNTIME_REQUIRES,
    TEMP_PREFIX,
    WheelBuildError,
    dist_name,
    package_name,
    runtime_sources,
    wheel_filename,
    write_wheel,
)


def _kernel_entries(table: DispatchTable) -> list[TableEntry]:
    return [e for e in table.entries if e.kind == "kernel"]


def _dist_info(table: DispatchTable) -> str:
    return f"{dist_name(table.name).replace('-', '_')}-{table.version}.dist-info"


def _metadata_lines(whl: Path, table: DispatchTable) -> list[str]:
    with zipfile.ZipFile(whl) as zf:
        return zf.read(f"{_dist_info(table)}/METADATA").decode().splitlines()


@pytest.fixture
def built(recorded_table, recorded_cubins, tmp_path) -> Path:
    return write_wheel(recorded_table, recorded_cubins, tmp_path / "dist")


def test_wheel_is_byte_identical_when_rebuilt(recorded_table, recorded_cubins, tmp_path):
    first = write_wheel(recorded_table, recorded_cubins, tmp_path / "a")
    reread = DispatchTable.from_bytes(recorded_table.to_bytes())
    second = write_wheel(reread, dict(recorded_cubins), tmp_path / "b")
    assert first.name == second.name
    assert first.read_bytes() == second.read_bytes()
    # rewriting in place replaces the file and leaves no temporary files behind
    again = write_wheel(recorded_table, recorded_cubins, tmp_path / "a")
    assert again == first and again.read_bytes() == second.read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [first.name]


def test_wheel_file_name(recorded_table, built):
    name = recorded_table.name.replace("-", "_").replace(".", "_").lower()
    assert built.name == f"cudal2_kernels_{name}-{recorded_table.version}-py3-none-any.whl"
    assert built.name == wheel_filename(recorded_table.name, recorded_table.version)


def test_names_are_normalised(recorded_table, recorded_cubins, tmp_path):
    name = "llama_3_8b_instruct"
    table = dataclasses.replace(recorded_table, name=name, package=package_name(name))
    whl = write_wheel(table, recorded_cubins, tmp_path)
    assert whl.name.startswith("cudal2_kernels_llama_3_8b_instruct-")
    meta = _metadata_lines(whl, table)
    assert "Name: cudal2-kernels-llama-3-8b-instruct" in meta


def test_package_name_is_the_manifests():
    manifest = load_manifest(default_manifest_path())
    assert manifest.package == package_name(manifest.name) == f"cudal2_kernels_{manifest.name}"


def test_wheel_members(recorded_table, built):
    pkg = recorded_table.package
    dist_info = _dist_info(recorded_table)
    shas = {e.cubin_sha256 for e in _kernel_entries(recorded_table)}
    expected = {f"{pkg}/__init__.py", f"{pkg}/dispatch.json"}
    expected |= {f"{pkg}/_runtime/{name}" for name in runtime_sources()}
    expected |= {f"{pkg}/cubins/{sha}.cubin" for sha in shas}
    expected |= {
        f"{dist_info}/{name}" for name in ("METADATA", "WHEEL", "RECORD", "entry_points.txt")
    }
    with zipfile.ZipFile(built) as zf:
        names = zf.namelist()
        infos = zf.infolist()
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
    assert set(names) == expected
    # the vLLM plugin: loaded by vLLM only, named after the op namespace
    assert entry_points == (
        f"[vllm.general_plugins]\ncudal2_{recorded_table.name} = {pkg}:vllm_register\n"
    )
    assert len(names) == len(expected)  # no member written twice
    package_members = [n for n in names if not n.startswith(dist_info)]
    assert package_members == sorted(package_members)
    assert names[-1] == f"{dist_info}/RECORD"
    for info in infos:
        assert info.date_time == (1980, 1, 1, 0, 0, 0), info.filename
        assert info.external_attr == 0o644 << 16, info.filename


def test_record_hashes_are_valid(built):
    with WheelFile(built) as whl:
        record = whl.read(whl.record_path).decode()
        members = {n: whl.read(n) for n in whl.namelist()}  # WheelFile checks each hash
        record_path = whl.record_path
    rows = list(csv.reader(io.StringIO(record)))
    assert rows[-1] == [record_path, "", ""]
    listed = {path: (digest, size) for path, digest, size in rows[:-1]}
    assert set(listed) == set(members) - {record_path}
    for path, (digest, size) in listed.items():
        data = members[path]
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f"sha256={want}", path
        assert int(size) == len(data), path


def test_metadata_and_wheel_files(recorded_table, built):
    meta = _metadata_lines(built, recorded_table)
    assert f"Name: {dist_name(recorded_table.name)}" in meta
    assert f"Version: {recorded_table.version}" in meta
    assert "Requires-Python: >=3.11" in meta
    assert [line for line in meta if line.startswith("Requires-Dist: ")] == [
        *(f"Requires-Dist: {req}" for req in RUNTIME_REQUIRES),
        'Requires-Dist: torch>=2.4; extra == "torch"',
        'Requires-Dist: cupy-cuda13x>=14; extra == "cupy"',
    ]
    # torch and CuPy are the user's choice: extras, each declared before its requirement
    extras = [line for line in meta if line.startswith(("Provides-Extra: ", "Requires-Dist: t"))]
    assert extras[0] == "Provides-Extra: torch" and "Provides-Extra: cupy" in meta
    assert any(line.startswith("Summary: ") and len(line) > len("Summary: ") for line in meta)
    with zipfile.ZipFile(built) as zf:
        wheel_lines = zf.read(f"{_dist_info(recorded_table)}/WHEEL").decode().splitlines()
    assert "Root-Is-Purelib: true" in wheel_lines
    assert "Tag: py3-none-any" in wheel_lines
    assert "Wheel-Version: 1.0" in wheel_lines


def test_generated_init(recorded_table, built):
    with zipfile.ZipFile(built) as zf:
        source = zf.read(f"{recorded_table.package}/__init__.py").decode()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree)
    for gpu in recorded_table.gpu_models:
        assert gpu in doc
    assert recorded_table.name in doc
    assert recorded_table.manifest_sha256 in doc
    assert "from ._runtime.api import bind" in source
    assert "_api = bind(__name__, NATIVE_SHA256)" in source
    assert "NATIVE_SHA256 = {}" in source  # a pure wheel: no native launcher
    assert "matmul = _api.matmul" in source
    assert "linear = _api.linear" in source
    versions = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and node.targets[0].id == "__version__"
    ]
    assert versions == [recorded_table.version]
    kernels = len(_kernel_entries(recorded_table))
    assert f"{len(recorded_table.entries)} dispatch entries, {kernels} of them kernels" in doc


def test_generated_init_keeps_table_strings_out_of_its_code(
    recorded_table, recorded_cubins, tmp_path
):
    """Table values are data: quotes and backslashes in them stay inside the docstring."""
    hostile = 'A """ B \\ C"'
    table = dataclasses.replace(recorded_table, tool_version=hostile, measured_to=hostile)
    with zipfile.ZipFile(write_wheel(table, recorded_cubins, tmp_path)) as zf:
        tree = ast.parse(zf.read(f"{table.package}/__init__.py").decode())
    doc = ast.get_docstring(tree)
    assert doc.startswith(f"HGEMM kernels precompiled by cudal2 {hostile} for ")
    assert doc.count(hostile) == 2


def test_runtime_is_copied(recorded_table, built):
    runtime_dir = Path(cudal2.packaging.runtime.__file__).parent
    on_disk = {p.name: p.read_bytes() for p in runtime_dir.glob("*.py")}
    assert "__init__.py" in on_disk
    prefix = f"{recorded_table.package}/_runtime/"
    with zipfile.ZipFile(built) as zf:
        shipped = {n[len(prefix) :]: zf.read(n) for n in zf.namelist() if n.startswith(prefix)}
    assert shipped == on_disk


def test_dispatch_json_round_trips(recorded_table, built):
    with zipfile.ZipFile(built) as zf:
        data = zf.read(f"{recorded_table.package}/dispatch.json")
    assert data == recorded_table.to_bytes()
    assert read_table(built) == recorded_table


def test_cubins_are_shipped(recorded_table, recorded_cubins, tmp_path):
    extra = b"a cubin no entry refers to"
    cubins = {**recorded_cubins, hashlib.sha256(extra).hexdigest(): extra}
    whl = write_wheel(recorded_table, cubins, tmp_path)
    prefix = f"{recorded_table.package}/cubins/"
    with zipfile.ZipFile(whl) as zf:
        shipped = {
            n[len(prefix) : -len(".cubin")]: zf.read(n)
            for n in zf.namelist()
            if n.startswith(prefix)
        }
    needed = {e.cubin_sha256 for e in _kernel_entries(recorded_table)}
    assert needed  # the recorded table has kernels
    assert shipped == {sha: recorded_cubins[sha] for sha in needed}


def test_missing_cubin_raises(recorded_table, recorded_cubins, tmp_path):
    missing = _kernel_entries(recorded_table)[0].cubin_sha256
    cubins = {k: v for k, v in recorded_cubins.items() if k != missing}
    with pytest.raises(WheelBuildError, match=missing):
        write_wheel(recorded_table, cubins, tmp_path / "dist")
    assert not any((tmp_path / "dist").glob("*.whl"))


def test_cubin_with_wrong_hash_raises(recorded_table, recorded_cubins, tmp_path):
    sha = _kernel_entries(recorded_table)[0].cubin_sha256
    cubins = {**recorded_cubins, sha: recorded_cubins[sha] + b"\0"}
    with pytest.raises(WheelBuildError, match="has sha256"):
        write_wheel(recorded_table, cubins, tmp_path)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("version", "1.0-beta"),  # PEP 440, but not its normalised spelling (1.0b0)
        ("version", "1.0a"),
        ("version", "1.0\n"),
        ("version", "\u0661.0"),  # an Arabic-Indic digit
        ("version", "1!2.0"),
        ("name", "-bad"),
        ("name", "Llama.3__8B-instruct"),  # cannot name a torch op namespace
        ("name", "a_"),
        ("name", "a" * 65),
        ("package", "not-a-module"),
        ("package", "cudal2_kernels_other"),
    ],
)
def test_bad_names_raise(recorded_table, recorded_cubins, tmp_path, key, value):
    """The writer applies the manifest's own rule (``name_problem``, ``wheel_version``)."""
    table = dataclasses.replace(recorded_table, **{key: value})
    with pytest.raises(WheelBuildError, match=key):
        write_wheel(table, recorded_cubins, tmp_path)
    assert not list(tmp_path.iterdir()), "nothing is written for a table that cannot name a wheel"


def test_out_dir_is_created(recorded_table, recorded_cubins, tmp_path):
    out = tmp_path / "x" / "y"
    whl = write_wheel(recorded_table, recorded_cubins, out)
    assert whl.parent == out and whl.is_file()


def test_what_a_killed_write_left_is_swept_and_nothing_else(
    recorded_table, recorded_cubins, tmp_path
):
    """The wheel is written as ``.cudal2-wheel-<host>.<pid>.<random>.part`` (no wheel's
    name) and renamed; the next write removes a dead writer's part, keeps a live one's,
    and leaves nothing of its own."""
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    live = owned_name(TEMP_PREFIX, ".part")
    left = live.replace(f".{os.getpid()}.", f".{dead}.")
    for name in (live, left):
        (out / name).write_bytes(b"PK half a wheel")
    whl = write_wheel(recorded_table, recorded_cubins, out)
    assert sorted(p.name for p in out.iterdir()) == sorted([whl.name, live])


def test_a_failed_write_leaves_nothing(recorded_table, recorded_cubins, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="No space"):
        write_wheel(recorded_table, recorded_cubins, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_wheel_installs_and_imports_without_cuda(recorded_table, built, tmp_path):
    target = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index"]
    pip += ["--disable-pip-version-check", "--target", str(target), str(built)]
    subprocess.run(pip, check=True, capture_output=True, cwd=tmp_path)
    pkg = recorded_table.package
    assert (target / pkg / "dispatch.json").is_file()
    # The shipped runtime is self-contained: importing the package must not pull in
    # cudal2 (which the user of a kernel wheel does not have).
    code = (
        f"import {pkg} as k; "
        "import json, sys; "
        "print(json.dumps([k.__version__, callable(k.matmul), callable(k.linear), "
        "'cudal2' in sys.modules]))"
    )
    # cwd is the install folder so the source tree's folders are not on sys.path.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(target)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=target, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [
        recorded_table.version,
        True,
        True,
        False,
    ]


def test_a_table_with_cublaslt_entries_requires_nvmath(selected_table, selected_cubins, tmp_path):
    wheel = write_wheel(selected_table, selected_cubins, tmp_path)
    meta = _metadata_lines(wheel, selected_table)
    requires = [
        line for line in meta if line.startswith("Requires-Dist: ") and "extra ==" not in line
    ]
    assert requires == [f"Requires-Dist: {r}" for r in (*RUNTIME_REQUIRES, *CUBLASLT_REQUIRES)]
    algos = sum(e.kind == "cublaslt" for e in selected_table.entries)
    with zipfile.ZipFile(wheel) as zf:
        init = zf.read(f"{selected_table.package}/__init__.py").decode()
    assert f"{algos} of them autotuned cuBLASLt algorithms" in init
