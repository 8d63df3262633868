"""The measuring worker's start-up (CPU side): its hello says how long each step took,
and the vendor spread makes its handles at first use, not at start-up."""

from __future__ import annotations

import pytest

from cudal2.records import GpuInfo
from cudal2.verify import worker

torch = pytest.importorskip("torch")
GPU = GpuInfo("NVIDIA H100 80GB HBM3", "sm_90a", 132, "580.00", "13.0")


class _Conn:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)

    def recv(self):
        return None  # the parent says stop at once

    def close(self):
        pass


def test_the_hello_carries_the_seconds_of_each_start_up_step(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(worker.driver, "ensure_context", lambda device: 1)
    monkeypatch.setattr(worker, "current_gpu", lambda device: GPU)
    monkeypatch.setattr(worker, "nvmath_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (79 << 30, 80 << 30))
    served = []
    real_serve = worker.serve
    monkeypatch.setattr(worker, "serve", lambda *a: served.append(a) or real_serve(*a))
    conn = _Conn()
    worker.worker_main(conn, 0)
    assert served[0][3].max_bytes == int((79 << 30) * 0.25)  # a quarter of the free memory
    (hello,) = conn.sent
    assert hello["hello"] == GPU.as_json() and hello["cublaslt_version"] is None
    steps = hello["startup_s"]
    assert list(steps) == [
        "before_main",
        "import_torch",
        "cuda_init",
        "driver_context",
        "gpu_info",
        "nvmath_import",
        "cublaslt_version",
        "in_main",
    ]
    assert all(v is None or v >= 0 for v in steps.values())
    in_main = sum(v for k, v in steps.items() if k not in ("before_main", "in_main"))
    assert steps["in_main"] == pytest.approx(in_main, abs=0.01)
    assert "measuring worker on device 0: start-up s: before_main" in capsys.readouterr().err


def test_process_age_is_this_processs_seconds_since_it_started():
    age = worker.process_age_s()
    assert age is not None and 0 <= age < 24 * 3600


def test_the_vendor_spread_makes_its_handles_at_first_use(monkeypatch):
    """Made with the worker, it touches neither the GPU nor cuBLAS until a job asks."""
    from cudal2.verify import spread

    made = []
    monkeypatch.setattr(spread, "Cublas", lambda *a: made.append("cublas") or "cublas")
    monkeypatch.setattr(spread, "lt_handle", lambda: made.append("lt") or 7)
    monkeypatch.setattr(torch, "empty", lambda *a, **k: torch.zeros(1, dtype=torch.uint8))
    vs = spread.VendorSpread()
    assert made == []
    assert vs.lt == 7 and vs.cublas == "cublas" and vs.lt == 7
    assert made == ["cublas", "lt"]  # once
