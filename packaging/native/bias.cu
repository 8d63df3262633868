// The bias add of the native launcher: c[m, n] += bias[n * stride], in place, for a
// contiguous [rows, cols] output. Rounds as torch's add_ does (fp32 sum, one rounding),
// so the result is bitwise torch's `out.add_(bias)`. Compiled once per build
// (packaging/native_build.py: nvcc -cubin -arch=sm_90a), shipped as _native/bias.cubin,
// loaded (hash-checked) by _runtime/native.py and launched by launcher.cpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

template <class T>
__device__ __forceinline__ void bias_add(T* c, const T* bias, long long rows, long long cols,
                                         long long stride) {
  long long total = rows * cols;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    float sum = static_cast<float>(c[i]) + static_cast<float>(bias[(i % cols) * stride]);
    c[i] = static_cast<T>(sum);
  }
}

extern "C" __global__ void cudal2_bias_add_fp16(__half* c, const __half* bias, long long rows,
                                                long long cols, long long stride) {
  bias_add(c, bias, rows, cols, stride);
}

extern "C" __global__ void cudal2_bias_add_bf16(__nv_bfloat16* c, const __nv_bfloat16* bias,
                                                long long rows, long long cols,
                                                long long stride) {
  bias_add(c, bias, rows, cols, stride);
}
