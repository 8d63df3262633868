// The most fp16 tensor-core work the H100 sustains under its power limit: a persistent
// kernel that loads its operand tiles into shared memory once, then only issues wgmma.
// No GEMM doing the same FLOPs can be faster under the same power limit (it must also
// move its operands), so this rate over the best vendor's bounds any kernel's speedup
// (bench/experiments/math_ceiling.py).
//
// One CTA per SM (the grid is a host knob: the SM count, or 128), two consumer
// warpgroups, a 128x256 tile per CTA per k16 step (as fast.cu and ThunderKittens) and
// fp32 accumulators in registers. Each CTA copies its own k tile of A [128 x 64] and
// B [256 x 64] (random or zero fp16, the host's choice) into the K-major 128-byte
// swizzle layout of the project's wgmma kernels (generator/templates/sm90_wgmma.cu.j2:
// 16-byte chunk c of row r at chunk c ^ (r % 8), 1024-byte aligned atoms), then runs
// `rounds` rounds of KTILES k tiles on it, one k tile (four k16 steps) per wgmma group
// with one group in flight, as sm90tma's consumers do. One k tile only: the prologue
// (48 KiB per CTA, from L2 after the first launch) stays under the first-stage fill any
// GEMM pays, so even a small shape's launches are not made slower than a GEMM's by it.
// Each thread writes the sum of its accumulators, so nothing is dead code; with
// rounds = 1 the sums of a CTA add up to KTILES * sum_k colsum(A)[k] * colsum(B)[k],
// which the host checks (a wrong layout or descriptor breaks it).
//
// math_n256: per warpgroup one m64n256k16 per k16 step (128 accumulators per thread).
// math_n128: the same tile as two m64n128k16 (B's rows 0-127, then 128-255).
// ABI: (const half* A, const half* B, float* out, int rounds); A [grid][128][64],
// B [grid][256][64], out [grid * 256]; block 256 threads; dynamic shared memory
// SMEM_BYTES (the host passes the same number; smem_bytes() reports it).
#include <cuda_fp16.h>
#include <stdint.h>

namespace {

typedef __half T;
constexpr int KTILES = 4;  // k tiles per round (each a wgmma group of four k16 steps)
constexpr int BM = 128;  // two consumer warpgroups of 64 rows
constexpr int BN = 256;
constexpr int BK = 64;  // one 128-byte swizzle atom of fp16 per row
constexpr int THREADS = 256;
constexpr int A_TILE = BM * BK;  // elements
constexpr int B_TILE = BN * BK;
// Descriptor units (16 bytes) between 64-row blocks.
constexpr uint64_t ROWS64_ENC = 64 * BK * 2 / 16;  // 8 KiB: +512 encoded, as sm90tma
constexpr int SMEM_BYTES = (A_TILE + B_TILE) * 2 + 1024;  // + alignment slack
static_assert(SMEM_BYTES <= 227 * 1024, "fits an SM");
// One CTA per SM: 128 fp32 accumulators and the addresses take more than 128 registers
// a thread (ptxas: 154), so two CTAs of 256 threads cannot share an SM's 64K registers.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// As generator/templates/ptx/wgmma_desc.cu.j2: start address >> 4 (bits 0-13), leading
// byte offset 1 (unused for a one-atom-wide K-major tile), stride byte offset 1024 >> 4
// between eight-row groups (bits 32-45), 128-byte swizzle (value 1 in bits 62-63).
__device__ __forceinline__ uint64_t make_desc(const T* tile) {
  const uint64_t addr = (smem_u32(tile) & 0x3FFFF) >> 4;
  return addr | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

// ROWS x 64 k, from a dense row-major block, into its swizzled tile.
template <int ROWS>
__device__ __forceinline__ void load_tile(T* tile, const T* __restrict__ src, int tid) {
#pragma unroll 4
  for (int i = tid; i < ROWS * 8; i += THREADS) {
    const int r = i >> 3;
    const int c = i & 7;  // 16-byte chunk of the row
    *reinterpret_cast<int4*>(tile + r * BK + ((c ^ (r & 7)) << 3)) =
        *reinterpret_cast<const int4*>(src + r * BK + c * 8);
  }
}

#define ACC8(d, i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define ACC64(d, o)                                                                         \
  ACC8(d, o), ACC8(d, o + 8), ACC8(d, o + 16), ACC8(d, o + 24), ACC8(d, o + 32),            \
      ACC8(d, o + 40), ACC8(d, o + 48), ACC8(d, o + 56)

#define REGS64                                                                          \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "              \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "    \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "    \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define REGS128_HI                                                                           \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "         \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "         \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, "   \
  "%111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, "     \
  "%125, %126, %127"

// D[64 x 256] += A[64 x 16] * B[256 x 16]^T, both K-major from shared memory.
__device__ __forceinline__ void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{" REGS64 ", " REGS128_HI "}, %128, %129, 1, 1, 1, 0, 0;\n"
      : ACC64(d, 0), ACC64(d, 64)
      : "l"(da), "l"(db));
}

// D[64 x 128] += A[64 x 16] * B[128 x 16]^T; d holds 64 of the thread's accumulators.
__device__ __forceinline__ void wgmma_n128(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{" REGS64 "}, %64, %65, 1, 1, 1, 0, 0;\n"
      : ACC64(d, 0)
      : "l"(da), "l"(db));
}

template <bool N128>
__device__ __forceinline__ void math(const T* __restrict__ A, const T* __restrict__ B,
                                     float* __restrict__ out, int rounds) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023));
  T* sB = sA + A_TILE;
  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  load_tile<BM>(sA, A + size_t(blockIdx.x) * A_TILE, tid);
  load_tile<BN>(sB, B + size_t(blockIdx.x) * B_TILE, tid);
  // Written through the generic proxy; wgmma reads through the async proxy.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  float d[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) d[i] = 0.f;
  const uint64_t da = make_desc(sA) + wg * ROWS64_ENC;  // this warpgroup's 64 rows
  const uint64_t db = make_desc(sB);
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) {
#pragma unroll
    for (int t = 0; t < KTILES; ++t) {
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {  // +32 bytes per k16 inside the atom: +2 encoded
        if (N128) {
          wgmma_n128(d, da + 2 * kk, db + 2 * kk);
          wgmma_n128(d + 64, da + 2 * kk, db + 2 * ROWS64_ENC + 2 * kk);  // B rows 128-255
        } else {
          wgmma_n256(d, da + 2 * kk, db + 2 * kk);
        }
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  // The wait names no register: without this fence on every accumulator the compiler may
  // read some of them before it, while the last group still writes them (measured: 256
  // accumulators of a CTA short of the last group's share).
#pragma unroll
  for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < 128; ++i) sum += d[i];
  out[size_t(blockIdx.x) * THREADS + tid] = sum;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    math_n256(const T* A, const T* B, float* out, int rounds) {
  math<false>(A, B, out, rounds);
}
extern "C" __global__ void __launch_bounds__(THREADS, 1)
    math_n128(const T* A, const T* B, float* out, int rounds) {
  math<true>(A, B, out, rounds);
}
// The host reads this kernel's dynamic shared-memory size from here (one number).
extern "C" __global__ void smem_bytes(int* out) { *out = SMEM_BYTES; }
