"""On a GPU: a stream-K kernel (sm90tma v5 ``streamk``, issue 22) launched again and
again on a stream, and replayed in a CUDA graph, gives the same bits: the owners add the
pieces in one order, and zero the flags they consumed for the next launch."""

from __future__ import annotations

import pytest

from cudal2.generator.compile import ArtifactCache, build
from cudal2.generator.families import sm90_tma
from cudal2.generator.space import launch_recipe
from cudal2.records import Target

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.mark.parametrize("mnk", [(4096, 4096, 1096), (256, 256, 8192), (1024, 1280, 1096)])
def test_tma_v5_streamk_repeats_bitwise_and_replays_in_a_graph(tmp_path, mnk):
    """The owners add the pieces in one order and zero the flags they consumed: launch
    after launch on a stream gives the same bits, and so does a CUDA graph's replay (the
    workspace made before the capture)."""
    from cudal2.packaging.runtime import driver
    from cudal2.verify.launch import launch_dense

    d = sm90_tma.streamk_designs("fp16")[-2]  # 128 x 256, 3 stages
    assert sm90_tma.tile_mn(d) == (128, 256) and d.knobs.stages == 3
    cache = ArtifactCache(tmp_path)
    b = build(d, cache)
    assert b.ok, b.error
    recipe = launch_recipe(d)
    kernel = driver.Kernel(cache.cubin(b.artifact_key), b.symbol, recipe["smem_bytes"])
    m, n, k = mnk
    t = Target("sm_90a", "fp16", "tn", m, n, k)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    stream = torch.cuda.current_stream()

    def run() -> None:  # on the current stream
        s = torch.cuda.current_stream().cuda_stream
        launch_dense(kernel, recipe, t, a.data_ptr(), w.data_ptr(), c.data_ptr(), s)

    run()
    first = c.clone()
    ref = (a.float() @ w.float().T).half()
    assert torch.allclose(first.float(), ref.float(), atol=0.05 * k**0.5, rtol=0.02)
    for _ in range(5):
        c.fill_(float("nan"))
        run()
        assert torch.equal(c, first)
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        run()  # the side stream's workspace, made outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=side):
            run()
    for _ in range(3):
        c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(c, first)
