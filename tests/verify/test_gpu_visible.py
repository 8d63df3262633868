"""``CUDA_VISIBLE_DEVICES`` as CUDA reads it, applied to nvidia-smi's rows (which list every
GPU of the host): ``gpu_names`` counts and orders the GPUs a host runner starts workers
on, ``visible_device`` is what a compute-sanitizer or ncu child is given for one of them."""

from __future__ import annotations

import pytest

from cudal2.verify import gpu

# nvidia-smi --query-gpu=index,uuid,name on a host of four GPUs
ROWS = [
    "0, GPU-aaaa1111-0000, NVIDIA H100 80GB HBM3",
    "1, GPU-bbbb2222-0000, NVIDIA H100 80GB HBM3",
    "2, GPU-cccc3333-0000, NVIDIA H200",
    "3, GPU-dddd4444-0000, NVIDIA H200",
]
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


@pytest.fixture
def smi(monkeypatch):
    def fake(query: str) -> list[str]:
        assert query.startswith("index,uuid,")
        return ROWS

    monkeypatch.setattr(gpu, "_smi", fake)


CASES = [
    # CUDA_VISIBLE_DEVICES (None: unset), the names CUDA sees, in its order
    (None, [H100, H100, H200, H200]),
    ("0,1,2,3", [H100, H100, H200, H200]),
    ("2", [H200]),
    ("3,0", [H200, H100]),
    (" 1 , 2 ", [H100, H200]),
    ("01", [H100]),  # an integer, however written
    ("", []),  # hides every GPU
    ("-1", []),
    ("0,7,1", [H100]),  # CUDA stops at the first entry that names no GPU
    ("0,0", [H100]),  # ...or one named twice
    ("GPU-cccc", [H200]),  # a UUID prefix
    ("GPU-cccc3333-0000,GPU-aaaa", [H200, H100]),
    ("GPU-", []),  # a prefix of every UUID names none
    ("GPU-zzzz", []),
    ("nonsense,0", []),
    ("MIG-1234", [H100, H100, H200, H200]),  # MIG: not mapped, every row kept
]


@pytest.mark.parametrize("spec, names", CASES)
def test_gpu_names_are_what_cuda_sees(smi, monkeypatch, spec, names):
    if spec is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    assert gpu.gpu_names() == names


@pytest.mark.parametrize(
    "spec, ordinal, child",
    [
        (None, 0, "0"),
        (None, 3, "3"),
        ("3,0", 0, "3"),
        ("3,0", 1, "0"),
        ("GPU-cccc,1", 0, "GPU-cccc"),
    ],
)
def test_a_child_process_is_given_its_gpu_alone(monkeypatch, spec, ordinal, child):
    if spec is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    assert gpu.visible_device(ordinal) == child


def test_a_device_not_visible_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0")
    with pytest.raises(ValueError, match="CUDA device 2 is not visible"):
        gpu.visible_device(2)


def test_no_nvidia_smi_no_gpus(monkeypatch):
    monkeypatch.setattr(gpu.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpu.gpu_names() == []


@pytest.mark.parametrize(
    "spec, device, child", [(None, 1, "1"), ("3,2", 1, "2"), (None, None, None)]
)
def test_memcheck_and_ncu_children_see_their_gpu_alone(monkeypatch, tmp_path, spec, device, child):
    """compute-sanitizer's and ncu's child processes get ``CUDA_VISIBLE_DEVICES`` of the
    GPU their job was given (None: the parent's environment as it is)."""
    import subprocess

    from cudal2.records import Target
    from cudal2.verify import profile, sanitizer

    if spec is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    envs = []

    def run(cmd, **kw):
        envs.append(kw.get("env"))
        return subprocess.CompletedProcess(cmd, 1, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(sanitizer, "find_sanitizer", lambda: "/bin/compute-sanitizer")
    monkeypatch.setattr(profile, "find_ncu", lambda: "/bin/ncu")
    t = Target("sm_90a", "fp16", "tn", 1, 8, 8)
    sanitizer.memcheck(tmp_path / "k.cubin", "k", {}, t, device=device)
    job = {"cubin": "k", "symbol": "k", "recipe": {}, "target": t.as_json()}
    profile.profile([job], device=device)
    assert len(envs) == 2
    seen = [(e or {}).get("CUDA_VISIBLE_DEVICES") for e in envs]
    assert seen == [child if child is not None else spec] * 2
