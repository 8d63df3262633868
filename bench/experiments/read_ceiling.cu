// The fastest the H100 moves a GEMM's compulsory bytes: read W and X once, write Y once,
// no arithmetic. No GEMM can take less time than the best of these on the same bytes, so
// best-vendor time / this time bounds any kernel's speedup (bench/experiments/read_ceiling.py).
//
// Each thread keeps U 16-byte loads in flight (ld.global.nc.L1::no_allocate), grid-stride
// over the buffer; the loaded words are folded into one value that every output store
// carries, so nothing can be optimised away.
#include <cstdint>

__device__ __forceinline__ int4 ld_stream(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int U>
__device__ __forceinline__ void read_fold(const int4* __restrict__ src, uint64_t n16,
                                          int4* __restrict__ dst, uint64_t nout16) {
  const uint64_t nth = uint64_t(gridDim.x) * blockDim.x;
  uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int acc = 0;
  for (; i + (U - 1) * nth < n16; i += U * nth) {
    int4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld_stream(src + i + u * nth);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += nth) {
    int4 v = ld_stream(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  for (uint64_t j = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < nout16; j += nth)
    dst[j] = make_int4(acc, acc, acc, acc);
}

extern "C" __global__ void read_u4(const int4* s, uint64_t n, int4* d, uint64_t nd) { read_fold<4>(s, n, d, nd); }
extern "C" __global__ void read_u8(const int4* s, uint64_t n, int4* d, uint64_t nd) { read_fold<8>(s, n, d, nd); }
extern "C" __global__ void read_u16(const int4* s, uint64_t n, int4* d, uint64_t nd) { read_fold<16>(s, n, d, nd); }
// The cost of a kernel boundary in a graph of back-to-back launches.
extern "C" __global__ void empty(const int4*, uint64_t, int4*, uint64_t) {}
