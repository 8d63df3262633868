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

// D[64 x 256] += A[64 x 16] * B[256 x 16]^T, both K-major from shared memory; d holds
// the thread's 128 accumulators.
__device__ __forceinline__ void wgmma_n256(float* d, uint64_t da, uint64_t db) {
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

#define REGS88_HI                                                                          \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "       \
  "%80, %81, %82, %83, %84, %85, %86, %87"

// D[64 x 176] += A[64 x 16] * B[176 x 16]^T; d holds 88 of the thread's accumulators.
__device__ __forceinline__ void wgmma_n176(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n176k16.f32.f16.f16 "
      "{" REGS64 ", " REGS88_HI "}, %88, %89, 1, 1, 1, 0, 0;\n"
      : ACC64(d, 0), ACC8(d, 64), ACC8(d, 72), ACC8(d, 80)
      : "l"(da), "l"(db));
}

// The narrow feed kernels' widths (the own kernels' tiles on the partial-wave shapes):
// eight consecutive operand names "%a, ..., %h"; a thread's first 40, 80, 96 and 112
// accumulators' operand names and operands (REGS64 and ACC64 are the first 64).
#define R8(a, b, c, d, e, f, g, h) \
  "%" #a ", %" #b ", %" #c ", %" #d ", %" #e ", %" #f ", %" #g ", %" #h
#define REGS40                                                                   \
  R8(0, 1, 2, 3, 4, 5, 6, 7) ", " R8(8, 9, 10, 11, 12, 13, 14, 15) ", "          \
      R8(16, 17, 18, 19, 20, 21, 22, 23) ", " R8(24, 25, 26, 27, 28, 29, 30, 31) \
      ", " R8(32, 33, 34, 35, 36, 37, 38, 39)
#define REGS80 \
  REGS64 ", " R8(64, 65, 66, 67, 68, 69, 70, 71) ", " R8(72, 73, 74, 75, 76, 77, 78, 79)
#define REGS96 \
  REGS80 ", " R8(80, 81, 82, 83, 84, 85, 86, 87) ", " R8(88, 89, 90, 91, 92, 93, 94, 95)
#define REGS112                                              \
  REGS96 ", " R8(96, 97, 98, 99, 100, 101, 102, 103) ", " \
      R8(104, 105, 106, 107, 108, 109, 110, 111)
#define ACC40(d) ACC8(d, 0), ACC8(d, 8), ACC8(d, 16), ACC8(d, 24), ACC8(d, 32)
#define ACC80(d) ACC64(d, 0), ACC8(d, 64), ACC8(d, 72)
#define ACC96(d) ACC80(d), ACC8(d, 80), ACC8(d, 88)
#define ACC112(d) ACC96(d), ACC8(d, 96), ACC8(d, 104)
// wgmma_n<n>: D[64 x n] += A[64 x 16] * B[n x 16]^T; d holds the thread's n / 2
// accumulators, operands %0 .. %(n / 2 - 1) (regs, acc), then the descriptors %a and %b.
#define WGMMA_NARROW(n, regs, a, b, acc)                                                   \
  __device__ __forceinline__ void wgmma_n##n(float* d, uint64_t da, uint64_t db) {         \
    asm volatile("wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.f16.f16 {" regs "}, %" #a  \
                 ", %" #b ", 1, 1, 1, 0, 0;\n"                                               \
                 : acc(d)                                                                  \
                 : "l"(da), "l"(db));                                                      \
  }
WGMMA_NARROW(80, REGS40, 40, 41, ACC40)
WGMMA_NARROW(160, REGS80, 80, 81, ACC80)
WGMMA_NARROW(192, REGS96, 96, 97, ACC96)
WGMMA_NARROW(224, REGS112, 112, 113, ACC112)

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

// ---------------------------------------------------------------------------------------
// The feed ceiling: the math kernel's wgmma plus the operand traffic of a real GEMM.
// Every feed kernel has one producer: a warpgroup whose first thread walks the GEMM's
// TM x TN output tiles, 128x256 but for feedtall (persistent: blockIdx.x, blockIdx.x +
// gridDim.x, ..., in groups of `group` M tiles down one N tile, as sm90tma's grouped
// walk) and TMA-loads every k tile of A [TM x 64] and B [TN x 64] of each (128-byte
// swizzle, 48 KiB a stage at 128x256) into a ring in shared memory. So each moves exactly
// the bytes (DRAM to L2 to shared memory) a GEMM of its tile and kind moves, in a GEMM's
// order.
//
// gemm_n256 (SYNC): the ring is a GEMM's: consumers wait for each stage, issue the four
//   k16 steps on it, release it; each tile's accumulators are stored to C (fp16) straight
//   from registers. A plain warp-specialised GEMM, checked against torch by the host.
// feed_n256 (!SYNC): the same loads, but the consumers never wait for them: they issue
//   the same wgmma on one fixed k tile (stage 0, loaded once), and the producer waits
//   only for its own loads before reusing a stage (a ring of STAGES - 1). Math and
//   traffic overlap perfectly, with no stall of either on the other, and C is not
//   written (its bytes are 2% of the operands' at K = 4096, 8% at K = 1024). No GEMM
//   of one-CTA 128x256 tiles moves fewer operand bytes, so none can be faster under the
//   same power.
// feedpaced_n256 (PACED): feed_n256 held to a GEMM's pace. Each consumer warpgroup's
//   leader counts the k tiles it has issued (a word in shared memory, after each
//   wait_group 1); the producer loads k tile `it` once both have issued it - STAGES + 1,
//   no further ahead than a GEMM's producer with a STAGES ring. The consumers never wait,
//   so the CTAs walk the tiles in step at the math's rate, as a GEMM's do (the unpaced
//   kernel's CTAs drift apart and read more from DRAM).
// feedtall_n176 (PACED, 256x176 tiles): the same with each consumer warpgroup on 128
//   rows, two m64n176k16 per k16 step (176 accumulators a thread): the fewest operand
//   bytes per output two consumer warpgroups' registers hold (256 x 192 does not fit).
//   Its last N tile may pass N; TMA fills the rest with zeros, as a GEMM's loads.
// feedsk_n256 (SK): feed_n256 with every SM's share of the work equal (stream-K without
//   its fixup): the whole waves of tiles as feed_n256's walk, then the last, partial
//   wave's k tiles (every k tile of its tiles, in the walk's order) cut into gridDim.x
//   contiguous runs of equal length, one a CTA, so a CTA's run may start and end inside
//   a tile. Its consumers sum each run's accumulators as they would a tile's; the partial
//   sums a stream-K GEMM writes and reads back are not moved (a real one moves more). So
//   no GEMM of one-CTA 128x256 tiles whose SMs share the work so, in this order, is
//   faster under the same power: the bound of the fourteenth slice's stream-K (a split
//   of the last wave aligned in K reads in another order: feedsplit_n256 bounds it).
// feedsplit_n256 (ALIGNED): feed_n256 with the last, partial wave's r tiles each cut into
//   p = gridDim.x / r equal pieces at the same k boundaries (r <= gridDim.x / 2; else
//   feed_n256's walk): CTA u takes piece u / r of tile u % r, so the CTAs sharing a row
//   or column of tiles read the same k tiles at once, where feedsk's runs start at
//   different k. As feedsk, the partial sums are not moved: the bound of that split.
// feedtallsk_n176 (PACED, SK): the same even share of feedtall's 256x176 tiles: the
//   fewest bytes and every SM at work.
// feed80_n80, feed160_n160, feed192_n192, feed224_n224: feed_n256 on 128 x 80, 160, 192
//   and 224 tiles, the widths of the own kernels (the third slice) and near the vendors'
//   on the shapes whose last wave a 128x256 tile leaves partial (1024x1280x8192,
//   4096x1280x8192, 1024x6144x4096, 1024x7168x8192): there they fill 0.97 of their waves.
// gemmpair_n256, feedpair_n256 (PAIR): the same in 2-CTA clusters along M (as cuBLAS's
//   128x256 2x1 kernels): the two CTAs take M tiles 2u and 2u + 1 of one N tile, and
//   each loads half of the shared B tile multicast into both, so a pair reads B from L2
//   once. The GEMM twin's consumers release a stage in both CTAs. The feed kernel's
//   consumers release nothing: a watcher thread in each producer warpgroup releases a
//   stage in both CTAs as its bytes land in its own, and a producer reuses a stage once
//   both watchers have (the partner's next multicast writes into both).
// ABI: (tmA, tmB, T* C, float* out, int M, int N, int K, int group); A [M, K] and
// B [N, K] K-major, their maps' boxes [64 k, TM rows] and [64 k, TN rows] (PAIR: B's
// [64 k, 128 rows], a half); M % TM (PAIR: 2 TM) = K % 64 = 0, and N % TN = 0 for the
// twins (the host checks); block 384 threads (PAIR: clusters of 2, gridDim.x even);
// dynamic shared memory FEED_SMEM_BYTES (feed_smem_bytes() reports it). out [gridDim.x * 256]: the feed
// kernels' accumulator sums (nothing is dead code), unused by the GEMM twins.

struct alignas(64) TmaMap {  // CUtensorMap: 128 opaque bytes
  uint64_t w[16];
};

constexpr int FEED_THREADS = 384;  // the producer warpgroup, then two consumers
constexpr int STAGES = 4;
// A feed kernel's tile, TM x TN outputs a CTA: a stage's elements of A and B, the 64-row
// blocks of A each consumer warpgroup takes (TM / 128), its accumulators a thread.
template <int TM, int TN>
struct Tile {
  static constexpr int A = TM * BK, B = TN * BK;
  static constexpr int STAGE_BYTES = (A + B) * 2;  // 128x256: 48 KiB; 256x176: 54 KiB
  static constexpr int RB = TM / 128;
  static constexpr int ACC = RB * TN / 2;
};
// The largest tile's ring, the full and empty barriers, the paced kernels' two counters.
constexpr int FEED_SMEM_BYTES = STAGES * Tile<256, 176>::STAGE_BYTES + 2 * STAGES * 8 + 8 + 1024;
static_assert(FEED_SMEM_BYTES <= 227 * 1024, "fits an SM");

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrive on the mbarrier at `bar`'s offset in cluster CTA `rank`, with the arrive's
// default semantics (as generator/templates/ptx/cluster.cu.j2): what it orders are the
// wgmma reads of the stage it releases, complete at the wait_group before it.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void mbar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void tma_load(void* dst, const TmaMap* map, int k, int row,
                                         uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(bar)
      : "memory");
}
// The same box at the same offset in both CTAs of the pair, counted on each one's `bar`.
__device__ __forceinline__ void tma_load_pair(void* dst, const TmaMap* map, int k, int row,
                                              uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(bar), "h"((uint16_t)3)
      : "memory");
}

// Tile `tile` of the grouped walk: `group` M tiles down one N tile, then the next N tile.
__device__ __forceinline__ void walk(int tile, int tiles_m, int tiles_n, int group, int& tm,
                                     int& tn) {
  const int per = group * tiles_n;
  const int first = tile / per * group;
  const int rows = min(group, tiles_m - first);
  const int r = tile % per;
  tm = first + r % rows;
  tn = r / rows;
}

// A CTA's work as runs of k tiles of one output tile each: its tiles of the walk
// (unit, unit + units, ...: whole tiles), then its share of the last partial wave: none
// (WALK: the walk takes it too), an equal share of its k tiles (SK: runs that may start
// and end inside a tile), or one of p = units / r equal pieces of one of its r tiles
// (ALIGNED: piece unit / r of tile unit % r, all cut at the same k boundaries; with
// p < 2 nothing is cut: the walk). next() gives each run's tile and its k tiles [k0, k1),
// false at the end.
enum Share { WALK = 0, SK = 1, ALIGNED = 2 };

struct Work {
  int tile, whole_end, units, KT, sk_base, sk_i, sk_end;
  __device__ __forceinline__ Work(int share, int unit, int units_, int tiles, int KT_)
      : tile(unit), units(units_), KT(KT_), sk_i(0), sk_end(0) {
    whole_end = share == WALK ? tiles : tiles / units_ * units_;
    sk_base = whole_end;
    const int r = tiles - whole_end;
    if (share == SK) {  // the rest, R k tiles, cut into `units` runs
      const int R = r * KT_;
      sk_i = int((long long)R * unit / units_);
      sk_end = int((long long)R * (unit + 1) / units_);
    } else if (share == ALIGNED && r > 0) {
      const int p = units_ / r;
      if (p < 2) {
        whole_end = tiles;  // no tile of the last wave can be cut in two: the walk
      } else if (unit < r * p) {
        const int piece = unit / r, t = unit % r;
        sk_i = t * KT_ + int((long long)KT_ * piece / p);
        sk_end = t * KT_ + int((long long)KT_ * (piece + 1) / p);
      }
    }
  }
  __device__ __forceinline__ bool next(int& t, int& k0, int& k1) {
    if (tile < whole_end) {
      t = tile, k0 = 0, k1 = KT;
      tile += units;
      return true;
    }
    if (sk_i < sk_end) {
      t = sk_base + sk_i / KT, k0 = sk_i % KT, k1 = min(KT, k0 + (sk_end - sk_i));
      sk_i += k1 - k0;
      return true;
    }
    return false;
  }
};

__device__ __forceinline__ uint32_t ld_volatile(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.volatile.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

template <int TM, int TN, bool SYNC, bool PAIR, bool PACED, int SHARE>
__device__ __forceinline__ void feed(const TmaMap* tmA, const TmaMap* tmB, T* __restrict__ C,
                                     float* __restrict__ out, int M, int N, int K, int group) {
  using TL = Tile<TM, TN>;
  static_assert(!SYNC || (TM == 128 && TN == 256), "the GEMM twins store 128x256 tiles");
  static_assert(!PACED || (!SYNC && !PAIR), "pacing is for the one-CTA feed kernels");
  static_assert(TN == 256 || TN == 176 || (TM == 128 && (TN == 80 || TN == 160 || TN == 192 ||
                                                           TN == 224)),
                "m64n256k16, m64n176k16, or a narrow width of 128-row tiles");
  static_assert(SHARE == WALK || (!SYNC && !PAIR), "a cut last wave is a one-CTA feed kernel's");
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  T* sA = reinterpret_cast<T*>(base);  // stage s: sA + s * TL::A, sB + s * TL::B
  T* sB = sA + STAGES * TL::A;
  const uint32_t full0 = smem_u32(base + STAGES * TL::STAGE_BYTES);
  const uint32_t empty0 = full0 + 8 * STAGES;
  const uint32_t done0 = empty0 + 8 * STAGES;  // PACED: k tiles each consumer has issued
  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  // PAIR: cluster u = blockIdx.x / 2 walks pair tiles (2 M tiles of one N tile); rank r
  // takes M tile 2 * tm + r. Otherwise each CTA walks the tiles. A last N tile past N
  // is loaded as a GEMM's would be: TMA fills what lies beyond N with zeros.
  const int rank = PAIR ? int(cluster_rank()) : 0;
  const int unit = PAIR ? blockIdx.x / 2 : blockIdx.x;
  const int units = PAIR ? gridDim.x / 2 : gridDim.x;
  const int tiles_m = M / TM / (PAIR ? 2 : 1), tiles_n = (N + TN - 1) / TN;
  const int tiles = tiles_m * tiles_n;
  const int walk_group = PAIR ? max(1, group / 2) : group;
  const int KT = K / BK;
  // The ring: stages FIRST .. STAGES - 1. Without SYNC, stage 0 is the consumers' k tile.
  constexpr int FIRST = SYNC ? 0 : 1;
  constexpr int RING = STAGES - FIRST;
  // A stage's empty barrier: SYNC, each consumer warpgroup of the CTA (PAIR: of both);
  // PAIR without SYNC, both watchers; else unused.
  constexpr int RELEASES = SYNC ? (PAIR ? 4 : 2) : 2;
  constexpr int B_ROWS = PAIR ? TN / 2 : TN;  // the rows of B a producer loads
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(full0 + 8 * s, 1);  // the producer's arrival and the bytes
      mbar_init(empty0 + 8 * s, RELEASES);
    }
    if (PACED) {
      asm volatile("st.shared.u32 [%0], 0;\n" ::"r"(done0) : "memory");
      asm volatile("st.shared.u32 [%0], 0;\n" ::"r"(done0 + 4) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (PAIR) cluster_sync();  // the partner's barriers exist before anything reaches them

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (tid == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmA)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(tmB)) : "memory");
      if (!SYNC) {  // the consumers' fixed k tile: the first tile's first k tile, locally
        mbar_expect(full0, TL::STAGE_BYTES);
        tma_load(sA, tmA, 0, 0, full0);
        for (int h = 0; h < TN / B_ROWS; ++h) tma_load(sB + h * B_ROWS * BK, tmB, 0, h * B_ROWS, full0);
      }
      int slot = 0, phase = 0, it = 0;
      Work work(SHARE, unit, units, tiles, KT);
      for (int tile, k0, k1; work.next(tile, k0, k1);) {
        int tm, tn;
        walk(tile, tiles_m, tiles_n, walk_group, tm, tn);
        if (PAIR) tm = 2 * tm + rank;
        for (int kt = k0; kt < k1; ++kt, ++it) {
          const int s = FIRST + slot;
          const uint32_t full = full0 + 8 * s, empty = empty0 + 8 * s;
          if (it >= RING) {
            // SYNC: every consumer released the stage. PAIR without SYNC: the watchers
            // saw its previous load land in both CTAs. Else: it landed here.
            mbar_wait((SYNC || PAIR ? empty : full), phase ^ 1);
          }
          if (PACED) {
            // No further ahead of the math than a GEMM's producer with a STAGES ring:
            // load `it` once both consumers have issued k tile it - STAGES + 1 (so that
            // k tile it - STAGES, whose stage a GEMM would reuse, is done).
            const int need = it - STAGES + 2;
            while (int(min(ld_volatile(done0), ld_volatile(done0 + 4))) < need) __nanosleep(32);
          }
          mbar_expect(full, TL::STAGE_BYTES);
          tma_load(sA + s * TL::A, tmA, kt * BK, tm * TM, full);
          T* dstB = sB + s * TL::B + rank * B_ROWS * BK;
          if (PAIR)
            tma_load_pair(dstB, tmB, kt * BK, tn * TN + rank * B_ROWS, full);
          else
            tma_load(dstB, tmB, kt * BK, tn * TN, full);
          if (++slot == RING) slot = 0, phase ^= 1;
        }
      }
      if (!SYNC && !PAIR) {  // no load may land after the CTA exits: wait for the last RING
        for (int j = max(0, it - RING); j < it; ++j)
          mbar_wait(full0 + 8 * (FIRST + j % RING), (j / RING) & 1);
      }
    } else if (!SYNC && PAIR && tid == 32) {
      // The watcher (a thread of the producer's second warp): as each load lands here,
      // it tells this CTA's producer and the partner's, which may then reuse the stage
      // once the partner's watcher has said the same. The producers never meet: the
      // consumers of a GEMM release a stage as eagerly. Every load has landed when it ends.
      int slot = 0, phase = 0;
      Work work(SHARE, unit, units, tiles, KT);
      for (int tile, k0, k1; work.next(tile, k0, k1);)
        for (int kt = k0; kt < k1; ++kt) {
          const uint32_t s = FIRST + slot;
          mbar_wait(full0 + 8 * s, phase);
          mbar_arrive(empty0 + 8 * s);
          mbar_arrive_cluster(empty0 + 8 * s, rank ^ 1);
          if (++slot == RING) slot = 0, phase ^= 1;
        }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int cw = wg - 1;  // this consumer's TM / 2 rows of the tile
    const int lane = tid & 31, w = (tid >> 5) & 3, g = lane >> 2, t4 = lane & 3;
    const bool leader = (tid & 127) == 0;
    if (!SYNC) mbar_wait(full0, 0);
    float sum = 0.f;
    int slot = 0, phase = 0;
    uint32_t issued = 0;  // PACED: k tiles issued over the walk
    Work work(SHARE, unit, units, tiles, KT);
    for (int tile, k0, k1; work.next(tile, k0, k1);) {
      int tm, tn;
      walk(tile, tiles_m, tiles_n, walk_group, tm, tn);
      if (PAIR) tm = 2 * tm + rank;
      float d[TL::ACC];
#pragma unroll
      for (int i = 0; i < TL::ACC; ++i) d[i] = 0.f;
      int prev = -1;
      for (int kt = k0; kt < k1; ++kt) {
        const int s = SYNC ? slot : 0;
        if (SYNC) mbar_wait(full0 + 8 * s, phase);
        const uint64_t da = make_desc(sA + s * TL::A) + cw * TL::RB * ROWS64_ENC;
        const uint64_t db = make_desc(sB + s * TL::B);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk)
#pragma unroll
          for (int rb = 0; rb < TL::RB; ++rb) {
            if constexpr (TN == 256)
              wgmma_n256(d + rb * 128, da + rb * ROWS64_ENC + 2 * kk, db + 2 * kk);
            else if constexpr (TN == 176)
              wgmma_n176(d + rb * 88, da + rb * ROWS64_ENC + 2 * kk, db + 2 * kk);
            else if constexpr (TN == 224)
              wgmma_n224(d, da + 2 * kk, db + 2 * kk);
            else if constexpr (TN == 192)
              wgmma_n192(d, da + 2 * kk, db + 2 * kk);
            else if constexpr (TN == 160)
              wgmma_n160(d, da + 2 * kk, db + 2 * kk);
            else
              wgmma_n80(d, da + 2 * kk, db + 2 * kk);
          }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (PACED && leader)
          asm volatile("st.volatile.shared.u32 [%0], %1;\n" ::"r"(done0 + 4 * cw), "r"(++issued)
                       : "memory");
        if (SYNC) {  // the previous k tile's group is done: its stage goes back
          if (prev >= 0 && leader) {
            mbar_arrive(empty0 + 8 * prev);
            if (PAIR) mbar_arrive_cluster(empty0 + 8 * prev, rank ^ 1);
          }
          prev = s;
          if (++slot == RING) slot = 0, phase ^= 1;
        }
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      if (SYNC && leader) {
        mbar_arrive(empty0 + 8 * prev);
        if (PAIR) mbar_arrive_cluster(empty0 + 8 * prev, rank ^ 1);
      }
#pragma unroll
      for (int i = 0; i < TL::ACC; ++i) asm volatile("" : "+f"(d[i])::"memory");  // after the wait
      if constexpr (SYNC) {
        // m64n256k16's layout: warp w holds rows 16w + g (+8) of the warpgroup's 64; n8
        // block i columns 8i + 2t4 and + 1.
#pragma unroll
        for (int i = 0; i < TN / 8; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int m = tm * TM + cw * 64 + w * 16 + g + h * 8;
            const int n = tn * TN + i * 8 + t4 * 2;
            *reinterpret_cast<__half2*>(C + (long long)m * N + n) =
                __floats2half2_rn(d[i * 4 + 2 * h], d[i * 4 + 2 * h + 1]);
          }
      } else {
#pragma unroll
        for (int i = 0; i < TL::ACC; ++i) sum += d[i];
      }
    }
    if (!SYNC) out[size_t(blockIdx.x) * 256 + (tid - 128)] = sum;
  }
  // PAIR: neither CTA exits while the partner may still arrive on its barriers or
  // multicast into its shared memory.
  if (PAIR) cluster_sync();
}

}  // namespace

#define FEED_KERNEL(name, tm, tn, sync, pair, paced, share, dims)                             \
  extern "C" __global__ void dims __launch_bounds__(FEED_THREADS, 1)                         \
      name(const __grid_constant__ TmaMap tmA, const __grid_constant__ TmaMap tmB, T* C,     \
           float* out, int M, int N, int K, int group) {                                     \
    feed<tm, tn, sync, pair, paced, share>(&tmA, &tmB, C, out, M, N, K, group);              \
  }
FEED_KERNEL(feed_n256, 128, 256, false, false, false, WALK, )
FEED_KERNEL(gemm_n256, 128, 256, true, false, false, WALK, )
FEED_KERNEL(feedpair_n256, 128, 256, false, true, false, WALK, __cluster_dims__(2, 1, 1))
FEED_KERNEL(gemmpair_n256, 128, 256, true, true, false, WALK, __cluster_dims__(2, 1, 1))
FEED_KERNEL(feedpaced_n256, 128, 256, false, false, true, WALK, )
FEED_KERNEL(feedtall_n176, 256, 176, false, false, true, WALK, )
FEED_KERNEL(feedsk_n256, 128, 256, false, false, false, SK, )
FEED_KERNEL(feedsplit_n256, 128, 256, false, false, false, ALIGNED, )
FEED_KERNEL(feedtallsk_n176, 256, 176, false, false, true, SK, )
FEED_KERNEL(feed80_n80, 128, 80, false, false, false, WALK, )
FEED_KERNEL(feed160_n160, 128, 160, false, false, false, WALK, )
FEED_KERNEL(feed192_n192, 128, 192, false, false, false, WALK, )
FEED_KERNEL(feed224_n224, 128, 224, false, false, false, WALK, )
extern "C" __global__ void feed_smem_bytes(int* out) { *out = FEED_SMEM_BYTES; }

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
