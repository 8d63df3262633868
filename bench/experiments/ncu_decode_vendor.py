"""Under ncu: the vendor's fastest 1x4096x4096 fp16 call (cuBLAS NN via torch.matmul on
W stored [K, N]) inside an NVTX range "vendor", for comparison with sm90csk's profile.

    ncu --nvtx --nvtx-include "vendor/" --section ... python bench/experiments/ncu_decode_vendor.py
"""

import torch

a = torch.rand(1, 4096, device="cuda", dtype=torch.float16) * 2 - 1
w = torch.rand(4096, 4096, device="cuda", dtype=torch.float16) * 2 - 1  # [K, N]
c = torch.matmul(a, w)  # warm-up: handles, workspace
torch.cuda.synchronize()
with torch.cuda.nvtx.range("vendor"):
    torch.matmul(a, w, out=c)
torch.cuda.synchronize()
