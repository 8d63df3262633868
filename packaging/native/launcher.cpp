// cudal2's native launcher: the torch op's CUDA kernel, entered once per call.
//
// Built once per `cudal2-build` (packaging/native_build.py) against torch's stable ABI
// (TORCH_TARGET_VERSION 2.11: the one binary serves torch 2.11 and newer), shipped in
// the wheel as `_native/libcudal2_native.so`, loaded by `_runtime/native.py` with
// ctypes after torch is imported. It links only libtorch_cpu (already loaded by then);
// the CUDA driver (libcuda.so.1) and torch's current-stream function (libtorch_cuda.so)
// are looked up at `cudal2_native_init`, so the library loads on a CPU-only torch too
// and simply is not used there.
//
// Division of work (docs/inference.md, "The native launcher"):
// - Python owns everything that happens once per shape: the table lookup, the GPU and
//   driver checks, loading cubins (hash-checked), cuBLASLt descriptors and workspaces.
//   A shape the native side has not seen calls the registry's `prepare` callback
//   (ctypes, with the GIL), which answers a plan id (after `cudal2_native_set_plan`)
//   or a fallback reason; the answer is remembered per (device, dtype, layout, M, N,
//   K, lda, ldb).
// - This file owns what happens on every call: the input checks (the ABI's rules, as
//   `_runtime/abi.py`), the output allocation (torch's allocator, so graph capture
//   draws from the graph's pool), the current stream, the tensor maps (cached per
//   pointer and shape), the launch through cuLaunchKernelEx (or cublasLtMatmul), the
//   bias add, and the counters. Anything it does not run goes to torch's own op
//   through the dispatcher: never a wrong answer.
// - CUDAL2_DISABLE=1 sends every call to torch; CUDAL2_NATIVE=0 sends every call to
//   the op's Python kernel (`<ns>::_linear_py`), so both paths run in one process.

#include <torch/csrc/stable/c/shim.h>

#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#define CUDAL2_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr int kAbi = 5;  // cudal2_native_abi(): bumped when the C interface changes
constexpr int kSlots = 8;  // op namespaces one copy of this library can serve
constexpr int kMaxPlans = 1 << 14;
constexpr size_t kReadyMax = 1 << 16;  // remembered shapes, as the Python runtime
constexpr size_t kTmapMax = 4096;
constexpr int32_t kHalf = 5, kBFloat16 = 15;  // torch ScalarType values (stable)
constexpr int32_t kCuda = 1;  // torch DeviceType::CUDA
constexpr int32_t kStrided = 0;  // torch Layout::Strided

// Fallback reasons, in `Stats`' names (`_runtime/api.py`); Python reads this list. The
// first eleven are found here; the rest are Python's answers to `prepare` (and
// `residual`, found by `fused_operands` for its tests: a fused op's call the kernel does
// not take goes to the op's Python kernel, which counts its own reason).
#define CUDAL2_REASONS(X)                                                                 \
  X(DISABLED, "disabled") X(RANK, "rank") X(SHAPE, "shape") X(EMPTY, "empty")              \
  X(STRIDE, "stride") X(DTYPE, "dtype") X(NOT_STRIDED, "not_strided") X(BIAS, "bias")      \
  X(ALIGNMENT, "alignment") X(DEVICE, "device") X(LAUNCH_ERROR, "launch_error")            \
  X(NO_ENTRY, "no_entry") X(FALLBACK_ENTRY, "fallback_entry") X(ALIGN, "align")            \
  X(FITS, "fits") X(ABI, "abi") X(CAPTURE, "capture") X(LOAD_ERROR, "load_error")          \
  X(ARCH, "arch") X(DRIVER, "driver") X(GPU, "gpu") X(TABLE, "table")                      \
  X(CUBLASLT_MISSING, "cublaslt_missing") X(CUBLASLT_VERSION, "cublaslt_version")          \
  X(CUBLASLT_ALGO, "cublaslt_algo") X(RESIDUAL, "residual")
#define CUDAL2_ENUM(id, name) R_##id,
#define CUDAL2_NAME(id, name) name,
enum Reason : int { CUDAL2_REASONS(CUDAL2_ENUM) kNumReasons };
const char* const kReasons[] = {CUDAL2_REASONS(CUDAL2_NAME)};

// The fused epilogues (records.EPILOGUES, `_runtime/abi.py` EPILOGUE_OPERANDS, in that
// order; Python reads this list and checks it): a table entry's `epilogue`, and the one a
// fused op's call asks `prepare` for.
#define CUDAL2_EPILOGUES(X)                                                               \
  X(NONE, "none") X(BIAS, "bias") X(RESIDUAL, "residual") X(BIAS_RESIDUAL, "bias_residual") \
  X(SILU, "silu") X(GELU_TANH, "gelu_tanh") X(RMSNORM, "rmsnorm")                            \
  X(RMSNORM_BIAS, "rmsnorm_bias") X(RMSNORM_SILU, "rmsnorm_silu")                            \
  X(RMSNORM_GELU_TANH, "rmsnorm_gelu_tanh") X(RMSNORM_ROPE_KV, "rmsnorm_rope_kv")              \
  X(RMSNORM_BIAS_ROPE_KV, "rmsnorm_bias_rope_kv")
#define CUDAL2_EPI_ENUM(id, name) E_##id,
enum Epilogue : int { CUDAL2_EPILOGUES(CUDAL2_EPI_ENUM) kNumEpilogues };
const char* const kEpilogues[] = {CUDAL2_EPILOGUES(CUDAL2_NAME)};
// A gated activation's output is [M, N / 2] (abi.EPILOGUE_ACTIVATION)
bool gated(int e) {
  return e == E_SILU || e == E_GELU_TANH || e == E_RMSNORM_SILU || e == E_RMSNORM_GELU_TANH;
}
// ... and the RMSNorm row scale's kernels take a trailing float eps (abi.ROW_SCALED)
bool row_scaled(int e) { return e >= E_RMSNORM; }
// RoPE and the KV-cache write (abi.ROPE_KV): their kernels take more operands after eps,
// which no fused op of this file passes: their plans are never launched from here (the
// Python path, `driver.launch_gemm` with `abi.RopeKvArgs`, serves them)
bool rope_kv(int e) { return e == E_RMSNORM_ROPE_KV || e == E_RMSNORM_BIAS_ROPE_KV; }
// The fused ops this file serves, by their stack layout (x, w, then):
enum FusedOp : int {
  F_RESIDUAL = 0,  // linear_residual: residual, bias?
  F_GATED = 1,     // linear_gated: act (str), eps (float?)
  F_RMSNORM = 2,   // linear_rmsnorm: eps (float), bias?
  kNumFused
};
const char* const kFusedNames[] = {"linear_residual", "linear_gated", "linear_rmsnorm"};
// `prepare`'s answer for a reason that must not be remembered (a kernel not loaded
// during graph capture: the next call outside capture loads it).
constexpr int32_t kTransient = 1 << 20;

// ---- the CUDA driver, looked up at init -------------------------------------------
struct Driver {
  decltype(&::cuLaunchKernelEx) launch = nullptr;
  decltype(&::cuTensorMapEncodeTiled) encode = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_current = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_retain = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuGetErrorName) error_name = nullptr;
  decltype(&::cuStreamIsCapturing) is_capturing = nullptr;
};
Driver drv;
using CurrentStreamFn = AOTITorchError (*)(int32_t, void**);
CurrentStreamFn current_stream = nullptr;
// torch >= 2.13: the message of the exception a shim call turned into an error code
// (looked up at init; absent on older torch, whose shim logs the message instead).
using ExceptionWhatFn = const char* (*)();
ExceptionWhatFn exception_what = nullptr;
// torch's own cuBLAS GEMMs (AOTInductor's C shim, kept across releases), for the calls
// whose plan is torch's: the same call aten::linear makes, without the dispatcher's
// lookup by name (~10 us a call). Absent: those calls go through the dispatcher.
using MmOutFn = AOTITorchError (*)(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle);
using AddmmOutFn = AOTITorchError (*)(AtenTensorHandle, AtenTensorHandle, AtenTensorHandle,
                                      AtenTensorHandle, double, double);
MmOutFn mm_out = nullptr;
AddmmOutFn addmm_out = nullptr;
std::mutex init_mu;
bool initialised = false;

// cublasLtMatmul's signature, with its opaque handles as pointers.
using LtMatmulFn = int (*)(void*, void*, const void*, const void*, void*, const void*, void*,
                           const void*, const void*, void*, void*, void*, const void*, void*,
                           size_t, void*);

// One table entry as it runs on one device (filled by Python: `cudal2_native_set_plan`).
struct PlanDesc {
  int32_t kind;  // 1 kernel, 2 cuBLASLt, 0 torch's GEMM (a fallback entry with an eager plan)
  int32_t abi;  // 1 gemm_v1, 2 gemm_v2 (two tensor maps, three with box_c), 3 gemm_v3 (+ epilogue)
  uint64_t function;  // CUfunction, loaded by Python in the device's primary context
  int32_t block[3];
  int32_t smem;
  int32_t tile_m, tile_n, split_k;
  int32_t cluster[3];
  int32_t persistent, ctas_per_sm, sm_count;
  int32_t box_a[2], box_b[2];
  int32_t box_c[2];  // C's box for a kernel that stores by TMA (its map after B's); 0: none
  int32_t pdl;  // launch with programmatic stream serialization
  // 1 + the id of the entry's eager alternative (an own kernel), launched in this plan's
  // place when the current stream is not capturing a CUDA graph; 0: none
  int32_t eager;
  // cuBLASLt (kind 2): the call prepared for one (M, N, K, lda, ldb)
  uint64_t lt_matmul, lt_handle, lt_desc, lt_w, lt_a, lt_c, lt_algo, lt_alpha, lt_beta;
  uint64_t lt_workspace_bytes;
  // the bias kernel for this entry's dtype (gemm output += bias[n])
  uint64_t bias_function;
  // gemm_v3: the recipe's epilogue (an `Epilogue`); a fused op's call launches the plan
  // only where it is the epilogue the call asked for
  int32_t epilogue;
  // 1: the kernel reads the residual through a fourth tensor map (sm90tma's R by TMA), R
  // [M, N] with row stride ldr in C's box, after C's map; 0: none. Keeps the record a
  // multiple of 8 bytes (it was `reserved` before ABI 5).
  int32_t tma_r;
};

using PrepareFn = int32_t (*)(int32_t slot, int32_t dev, int32_t dtype, int32_t layout,
                              int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                              int32_t epilogue);
using WorkspaceFn = int32_t (*)(int32_t slot, int32_t dev, uint64_t stream, uint64_t* ptr,
                                uint64_t* bytes);
using EventFn = void (*)(int32_t slot, int32_t plan, int32_t code, const char* message);

struct ShapeKey {
  int64_t v[9];  // dev, dtype, layout, m, n, k, lda, ldb, epilogue
  bool operator==(const ShapeKey& o) const { return std::memcmp(v, o.v, sizeof v) == 0; }
};
struct TmapKey {
  uint64_t v[6];  // ptr, rows, k, ld, box0, box1
  bool operator==(const TmapKey& o) const { return std::memcmp(v, o.v, sizeof v) == 0; }
};
template <class K>
struct Hash {
  size_t operator()(const K& key) const {
    uint64_t h = 1469598103934665603ull;
    for (auto x : key.v) {
      h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    }
    return h;
  }
};

struct Slot {
  bool used = false;
  std::string ns, linear_py, matmul_py, fused_ops[kNumFused], fused_py[kNumFused];
  PrepareFn prepare = nullptr;
  WorkspaceFn workspace = nullptr;
  EventFn event = nullptr;
  TorchLibraryHandle lib = nullptr;
  std::mutex mu;
  std::unordered_map<ShapeKey, int32_t, Hash<ShapeKey>> ready;
  std::vector<PlanDesc> plans;
  std::vector<uint8_t> dead;
  std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> workspaces;  // dev<<48^stream
  std::atomic<int64_t> hits[kMaxPlans];
  std::atomic<int64_t> fallbacks[kNumReasons];
};
Slot slots[kSlots];

std::mutex tmap_mu;
std::unordered_map<TmapKey, CUtensorMap, Hash<TmapKey>> tmaps;
std::mutex ctx_mu;
std::unordered_map<int32_t, CUcontext> primary;

// ---- the ABI's rules (`_runtime/abi.py`), on plain arrays --------------------------
struct Operands {
  int32_t layout;  // 0 tn, 1 nn
  int64_t m, n, k, lda, ldb;
};

// Row stride of the [M, K] matrix a [..., K] array's leading dims collapse into, or -1.
int64_t row_stride(const int64_t* shape, const int64_t* strides, int64_t ndim, int64_t k) {
  int64_t ld = -1, rows = 1;
  for (int64_t i = ndim - 2; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (ld < 0) {
      ld = strides[i];
    } else if (strides[i] != ld * rows) {
      return -1;
    }
    rows *= shape[i];
  }
  return ld < 0 ? k : ld;
}

int with_a(Operands* o, const int64_t* sa, const int64_t* ta, int64_t na) {
  if (ta[na - 1] != 1) return R_STRIDE;
  o->lda = row_stride(sa, ta, na, o->k);
  if (o->lda < o->k || o->lda % 8 || o->ldb % 8 || o->n % 8) return R_STRIDE;
  return -1;
}

// x [..., K] @ w[N, K]^T; -1 or a reason.
int linear_operands(const int64_t* sx, const int64_t* tx, int64_t nx, const int64_t* sw,
                    const int64_t* tw, int64_t nw, Operands* o) {
  if (nx < 1 || nw != 2) return R_RANK;
  o->k = sx[nx - 1];
  o->n = sw[0];
  if (o->k != sw[1]) return R_SHAPE;
  o->m = 1;
  for (int64_t i = 0; i + 1 < nx; ++i) o->m *= sx[i];
  if (o->m == 0 || o->n == 0 || o->k == 0) return R_EMPTY;
  if (tw[1] != 1 || tw[0] < o->k) return R_STRIDE;
  o->layout = 0;
  o->ldb = tw[0];
  return with_a(o, sx, tx, nx);
}

// a [M, K] @ b (row-major [K, N]: nn, or the transpose view of a row-major [N, K]: tn).
int matmul_operands(const int64_t* sa, const int64_t* ta, int64_t na, const int64_t* sb,
                    const int64_t* tb, int64_t nb, Operands* o) {
  if (na != 2 || nb != 2) return R_RANK;
  o->m = sa[0];
  o->k = sa[1];
  o->n = sb[1];
  if (o->k != sb[0]) return R_SHAPE;
  if (o->m == 0 || o->n == 0 || o->k == 0) return R_EMPTY;
  if (tb[1] == 1 && tb[0] >= o->n) {
    o->layout = 1;
    o->ldb = tb[0];
  } else if (tb[0] == 1 && tb[1] >= o->k) {
    o->layout = 0;
    o->ldb = tb[1];
  } else {
    return R_STRIDE;
  }
  return with_a(o, sa, ta, na);
}

// ---- tensors through the stable C shim ---------------------------------------------
struct View {
  AtenTensorHandle h = nullptr;
  int64_t ndim = 0;
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  int32_t dtype = -1, device_type = -1, device_index = -1, layout = -1;
  void* data = nullptr;
};

// False when the shim refuses (a tensor without sizes or strides: nested).
bool read(AtenTensorHandle h, View* v) {
  v->h = h;
  return aoti_torch_get_layout(h, &v->layout) == AOTI_TORCH_SUCCESS && v->layout == kStrided &&
         aoti_torch_get_dim(h, &v->ndim) == AOTI_TORCH_SUCCESS &&
         aoti_torch_get_sizes(h, &v->sizes) == AOTI_TORCH_SUCCESS &&
         aoti_torch_get_strides(h, &v->strides) == AOTI_TORCH_SUCCESS &&
         aoti_torch_get_dtype(h, &v->dtype) == AOTI_TORCH_SUCCESS &&
         aoti_torch_get_device_type(h, &v->device_type) == AOTI_TORCH_SUCCESS &&
         aoti_torch_get_device_index(h, &v->device_index) == AOTI_TORCH_SUCCESS &&
         aoti_torch_get_data_ptr(h, &v->data) == AOTI_TORCH_SUCCESS;
}

bool env_is(const char* name, const char* value) {
  const char* got = std::getenv(name);
  return got != nullptr && std::strcmp(got, value) == 0;
}

// ---- launching -----------------------------------------------------------------------
struct CtxGuard {  // the device's primary context current for the launch
  bool pushed = false;
  CUresult status = CUDA_SUCCESS;
  explicit CtxGuard(int32_t dev) {
    CUcontext want = nullptr, have = nullptr;
    {
      std::lock_guard<std::mutex> lock(ctx_mu);
      auto it = primary.find(dev);
      if (it != primary.end()) {
        want = it->second;
      } else {
        CUdevice d;
        status = drv.device_get(&d, dev);
        if (status == CUDA_SUCCESS) status = drv.primary_retain(&want, d);
        if (status != CUDA_SUCCESS) return;
        primary[dev] = want;
      }
    }
    status = drv.ctx_current(&have);
    if (status == CUDA_SUCCESS && have != want) {
      status = drv.ctx_push(want);
      pushed = status == CUDA_SUCCESS;
    }
  }
  ~CtxGuard() {
    if (pushed) {
      CUcontext popped;
      drv.ctx_pop(&popped);
    }
  }
};

// Whether the current stream of `dev` is capturing a CUDA graph (true where it cannot be
// told: the entry's own choice is right under capture and merely slower eagerly).
bool capturing(int32_t dev) {
  void* stream = nullptr;
  if (current_stream(dev, &stream) != AOTI_TORCH_SUCCESS) return true;
  CtxGuard guard(dev);
  if (guard.status != CUDA_SUCCESS) return true;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return drv.is_capturing(static_cast<CUstream>(stream), &status) != CUDA_SUCCESS ||
         status != CU_STREAM_CAPTURE_STATUS_NONE;
}

CUresult tensor_map(CUtensorMap* out, uint64_t ptr, uint64_t rows, uint64_t k, uint64_t ld,
                    const int32_t* box) {
  TmapKey key{{ptr, rows, k, ld, static_cast<uint64_t>(box[0]), static_cast<uint64_t>(box[1])}};
  {
    std::lock_guard<std::mutex> lock(tmap_mu);
    auto it = tmaps.find(key);
    if (it != tmaps.end()) {
      *out = it->second;
      return CUDA_SUCCESS;
    }
  }
  cuuint64_t dims[2] = {k, rows};
  cuuint64_t strides[1] = {2 * ld};
  cuuint32_t boxes[2] = {static_cast<cuuint32_t>(box[0]), static_cast<cuuint32_t>(box[1])};
  cuuint32_t elem[2] = {1, 1};
  // the swizzle of a box row's bytes where that is 32 or 64 (the TMA store's narrow boxes
  // of C), else 128 (every A and B box): driver.swizzle_bytes
  const int row_bytes = 2 * box[0];
  const CUtensorMapSwizzle swizzle = row_bytes == 32   ? CU_TENSOR_MAP_SWIZZLE_32B
                                     : row_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                       : CU_TENSOR_MAP_SWIZZLE_128B;
  CUresult r = drv.encode(out, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, reinterpret_cast<void*>(ptr),
                          dims, strides, boxes, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(tmap_mu);
    if (tmaps.size() >= kTmapMax) tmaps.clear();
    tmaps.emplace(key, *out);
  }
  return r;
}

// ABI gemm_v3's operands after gemm_v2's (`EpilogueArgs`), and the output's row stride.
struct EpiArgs {
  uint64_t bias = 0, residual = 0;  // device pointers, 0 where the epilogue reads none
  int64_t ldr = 0;  // the residual's row stride (elements)
  float eps = 0.0f;  // a ROW_SCALED epilogue's, passed as the kernel's trailing float
  int64_t ldc = 0;  // the output's row stride: N, or N / 2 after a gated activation
};

// A plan's grid for an M x N output, as driver.gemm_grid: one CTA per tile (and K
// split) in whole clusters; a persistent plan one CTA per tile up to its slots, and with
// a cluster along x (sm90tma's persistent multicast pair, cluster (2, 1, 1)) whole
// clusters, each walking cluster tiles (ceil(M tiles / cx) x N tiles): cx x min(cluster
// tiles, slots / cx), as driver.persistent_grid. cluster[0] == 1: exactly as before.
void kernel_grid(const PlanDesc& p, int64_t m, int64_t n, unsigned grid[3]) {
  int64_t gx = (n + p.tile_n - 1) / p.tile_n, gy = (m + p.tile_m - 1) / p.tile_m;
  if (p.persistent) {
    int64_t slots_ = static_cast<int64_t>(p.sm_count) * p.ctas_per_sm;
    const int64_t cx = p.cluster[0] > 1 ? p.cluster[0] : 1;
    if (cx == 1) {
      grid[0] = static_cast<unsigned>(gx * gy < slots_ ? gx * gy : slots_);
    } else {
      const int64_t cluster_tiles = (gy + cx - 1) / cx * gx;
      const int64_t clusters = slots_ / cx > 1 ? slots_ / cx : 1;
      grid[0] = static_cast<unsigned>(cx * (cluster_tiles < clusters ? cluster_tiles : clusters));
    }
    grid[1] = grid[2] = 1;
  } else {
    grid[0] = static_cast<unsigned>((gx + p.cluster[0] - 1) / p.cluster[0] * p.cluster[0]);
    grid[1] = static_cast<unsigned>((gy + p.cluster[1] - 1) / p.cluster[1] * p.cluster[1]);
    grid[2] = static_cast<unsigned>(p.split_k);
  }
}

// Launch a plan's kernel; `epi` (gemm_v3 plans only, and then required) appends the
// epilogue's operands as `driver.launch_gemm` does: bias, residual, ldr, then eps for a
// ROW_SCALED epilogue alone (the other kernels have no such parameter).
CUresult launch_kernel(const PlanDesc& p, uint64_t a, uint64_t b, uint64_t c, const Operands& o,
                       CUstream stream, const EpiArgs* epi = nullptr) {
  int32_t m = static_cast<int32_t>(o.m), n = static_cast<int32_t>(o.n),
          k = static_cast<int32_t>(o.k);
  if ((p.abi == 3) != (epi != nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (rope_kv(p.epilogue)) return CUDA_ERROR_INVALID_VALUE;  // operands not passed here
  long long lda = o.lda, ldb = o.ldb, ldc = epi != nullptr ? epi->ldc : o.n;
  void* pa = reinterpret_cast<void*>(a);
  void* pb = reinterpret_cast<void*>(b);
  void* pc = reinterpret_cast<void*>(c);
  void* pbias = epi != nullptr ? reinterpret_cast<void*>(epi->bias) : nullptr;
  void* pres = epi != nullptr ? reinterpret_cast<void*>(epi->residual) : nullptr;
  long long ldr = epi != nullptr ? epi->ldr : 0;
  float eps = epi != nullptr ? epi->eps : 0.0f;
  CUtensorMap ta, tb, tc, tr;
  void* args[16] = {&pa, &pb, &pc, &m, &n, &k, &lda, &ldb, &ldc};
  int n_args = 9;
  if (p.abi == 2 || p.abi == 3) {
    CUresult r = tensor_map(&ta, a, o.m, o.k, o.lda, p.box_a);
    if (r == CUDA_SUCCESS) r = tensor_map(&tb, b, o.n, o.k, o.ldb, p.box_b);
    // C [M, N] with row stride ldc, for a kernel that stores by TMA; a gated activation's
    // output [M, N / 2]
    const int64_t c_cols = gated(p.epilogue) ? o.n / 2 : o.n;
    if (r == CUDA_SUCCESS && p.box_c[0] > 0) r = tensor_map(&tc, c, o.m, c_cols, ldc, p.box_c);
    // R [M, N] with row stride ldr, in C's box (a kernel that reads the residual by TMA)
    if (p.tma_r && (epi == nullptr || p.box_c[0] <= 0)) return CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && p.tma_r) r = tensor_map(&tr, epi->residual, o.m, o.n, ldr, p.box_c);
    if (r != CUDA_SUCCESS) return r;
    args[n_args++] = &ta;
    args[n_args++] = &tb;
    if (p.box_c[0] > 0) args[n_args++] = &tc;
    if (p.tma_r) args[n_args++] = &tr;
  }
  // gemm_v3's epilogue operands (a kernel of another ABI has no more parameters: the
  // driver reads only as many as the kernel declares)
  args[n_args++] = &pbias;
  args[n_args++] = &pres;
  args[n_args++] = &ldr;
  args[n_args++] = &eps;
  CUlaunchConfig cfg{};
  unsigned grid[3];
  kernel_grid(p, o.m, o.n, grid);
  cfg.gridDimX = grid[0];
  cfg.gridDimY = grid[1];
  cfg.gridDimZ = grid[2];
  cfg.blockDimX = p.block[0];
  cfg.blockDimY = p.block[1];
  cfg.blockDimZ = p.block[2];
  cfg.sharedMemBytes = p.smem;
  cfg.hStream = stream;
  CUlaunchAttribute attrs[2];
  unsigned n_attrs = 0;
  if (p.cluster[0] * p.cluster[1] * p.cluster[2] > 1) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n_attrs].value.clusterDim.x = p.cluster[0];
    attrs[n_attrs].value.clusterDim.y = p.cluster[1];
    attrs[n_attrs].value.clusterDim.z = p.cluster[2];
    ++n_attrs;
  }
  if (p.pdl) {
    attrs[n_attrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n_attrs].value.programmaticStreamSerializationAllowed = 1;
    ++n_attrs;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n_attrs;
  return drv.launch(&cfg, reinterpret_cast<CUfunction>(p.function), args, nullptr);
}

CUresult launch_bias(uint64_t fn, uint64_t c, const View& bias, const Operands& o,
                     CUstream stream) {
  void* pc = reinterpret_cast<void*>(c);
  void* pb = bias.data;
  long long rows = o.m, cols = o.n, stride = bias.strides[0];
  void* args[5] = {&pc, &pb, &rows, &cols, &stride};
  long long total = rows * cols;
  CUlaunchConfig cfg{};
  cfg.gridDimX = static_cast<unsigned>((total + 255) / 256 < 2147483647 ? (total + 255) / 256
                                                                         : 2147483647);
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 256;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = stream;
  return drv.launch(&cfg, reinterpret_cast<CUfunction>(fn), args, nullptr);
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

std::string describe(const View& v, const char* name) {
  std::string s = std::string(name) + " [";
  for (int64_t i = 0; i < v.ndim; ++i) s += (i ? ", " : "") + std::to_string(v.sizes[i]);
  s += "] stride [";
  for (int64_t i = 0; i < v.ndim; ++i) s += (i ? ", " : "") + std::to_string(v.strides[i]);
  s += "] dtype " + std::to_string(v.dtype) + " device " + std::to_string(v.device_type) + ":" +
       std::to_string(v.device_index);
  return s;
}

// The call torch serves: `op` (aten::linear / aten::matmul, or the Python kernel) with the
// boxed inputs as they came (the dispatcher takes ownership of them).
void redispatch(const char* op, StableIValue* stack, const char* what) {
  AOTITorchError err = torch_call_dispatcher(op, "", stack, TORCH_ABI_VERSION);
  if (err != AOTI_TORCH_SUCCESS) {
    const char* torch_says = exception_what != nullptr ? exception_what() : nullptr;
    fail(std::string("cudal2: ") + op + " refused the inputs of " + what + ": " +
         (torch_says != nullptr ? torch_says : "torch's own message is in the log above"));
  }
}

int32_t lookup(Slot& s, int si, const ShapeKey& key, int32_t dtype, const Operands& o, int dev) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.ready.find(key);
    if (it != s.ready.end()) return it->second;
  }
  int32_t got = s.prepare(si, dev, dtype, o.layout, o.m, o.n, o.k, o.lda, o.ldb,
                          static_cast<int32_t>(key.v[8]));
  bool transient = got < 0 && ((-got - 1) & kTransient);
  if (got < 0) got = -(((-got - 1) & ~kTransient) + 1);
  if (!transient) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.ready.size() >= kReadyMax) s.ready.clear();
    s.ready.emplace(key, got);
  }
  return got;
}

// The output of a call: [..., N] (linear) or [M, N], contiguous, from torch's allocator
// (`columns` in place of N where given: a gated epilogue's N / 2).
AtenTensorHandle new_output(bool is_linear, const View& a, const Operands& o,
                            int64_t columns = 0) {
  int64_t out_dim = is_linear ? a.ndim : 2;
  int64_t sizes[64], strides[64];
  if (out_dim > 64) fail("cudal2: more than 64 dimensions");
  for (int64_t i = 0; i + 1 < out_dim; ++i) sizes[i] = is_linear ? a.sizes[i] : o.m;
  sizes[out_dim - 1] = columns > 0 ? columns : o.n;
  int64_t st = 1;
  for (int64_t i = out_dim - 1; i >= 0; --i) {
    strides[i] = st;
    st *= sizes[i];
  }
  AtenTensorHandle out = nullptr;
  if (aoti_torch_empty_strided(out_dim, sizes, strides, a.dtype, kCuda, a.device_index, &out) !=
      AOTI_TORCH_SUCCESS) {
    fail(std::string("cudal2: cannot allocate the output for ") + describe(a, "x"));
  }
  return out;
}

bool contiguous(const View& v) {
  int64_t expected = 1;
  for (int64_t i = v.ndim - 1; i >= 0; --i) {
    if (v.sizes[i] != 1 && v.strides[i] != expected) return false;
    expected *= v.sizes[i];
  }
  return true;
}

// Torch's own GEMM for a call no kernel runs, the one aten::linear / aten::matmul make
// for these operands (mm, or addmm with the bias), into a new output: true, with the
// output in stack[0] and the inputs released; false (nothing done) where the shim lacks
// the functions or refuses, and the caller goes through the dispatcher.
bool torch_gemm(bool is_linear, const View& a, const View& b, const View* bias, const Operands& o,
                StableIValue* stack) {
  if (mm_out == nullptr || addmm_out == nullptr) return false;
  if (bias != nullptr && a.ndim > 2 && !contiguous(a)) {
    return false;  // aten::linear: matmul, then add_ (rounded twice): the dispatcher's
  }
  // Views of the inputs (the shim's storage offset is added to the tensor's own: 0 keeps
  // it). A as [M, K] (the leading dims collapsed, row stride lda); B^T as [K, N]
  int64_t a_sizes[2] = {o.m, o.k}, a_strides[2] = {o.lda, 1};
  int64_t b_sizes[2] = {o.k, o.n};
  int64_t b_strides[2] = {o.layout == 0 ? 1 : o.ldb, o.layout == 0 ? o.ldb : 1};
  int64_t c_sizes[2] = {o.m, o.n}, c_strides[2] = {o.n, 1};
  AtenTensorHandle a2 = nullptr, bt = nullptr, c2 = nullptr, out = new_output(is_linear, a, o);
  // 2-D operands are used as they are (a view costs an allocation); linear's weight is
  // always viewed transposed, and an N-D input and its output collapsed.
  bool flat = a.ndim == 2;
  bool ok = (flat || aoti_torch__reinterpret_tensor(a.h, 2, a_sizes, a_strides, 0, &a2) ==
                         AOTI_TORCH_SUCCESS) &&
            (!is_linear || aoti_torch__reinterpret_tensor(b.h, 2, b_sizes, b_strides, 0, &bt) ==
                               AOTI_TORCH_SUCCESS) &&
            (flat || aoti_torch__reinterpret_tensor(out, 2, c_sizes, c_strides, 0, &c2) ==
                         AOTI_TORCH_SUCCESS);
  if (ok) {
    AtenTensorHandle x = flat ? a.h : a2, y = is_linear ? bt : b.h, c = flat ? out : c2;
    ok = (bias != nullptr ? addmm_out(c, bias->h, x, y, 1.0, 1.0) : mm_out(c, x, y)) ==
         AOTI_TORCH_SUCCESS;
  }
  for (AtenTensorHandle h : {a2, bt, c2}) {
    if (h != nullptr) aoti_torch_delete_tensor_object(h);
  }
  if (!ok) {
    aoti_torch_delete_tensor_object(out);
    return false;
  }
  aoti_torch_delete_tensor_object(a.h);
  aoti_torch_delete_tensor_object(b.h);
  if (bias != nullptr) {
    aoti_torch_delete_tensor_object(bias->h);
    delete reinterpret_cast<StableIValue*>(stack[2]);  // torch 2.11's boxed optional
  }
  stack[0] = reinterpret_cast<StableIValue>(out);
  return true;
}

// A `linear` call with a bias whose shape the table serves with a gemm_v3 kernel of
// epilogue `bias` (A W^T + bias summed in fp32, rounded once: `Api._linear`'s fused-bias
// entry, which the Python path tries first): launch it. True when launched (output in
// stack[0], inputs released, a hit counted); false leaves the call to the plain entry and
// the bias kernel, as the Python path does when its fused try answers a reason: no such
// entry (remembered per shape by `lookup`), a fallback entry, a kernel not loaded, a
// failed launch (the plan is then marked dead and reported, as `run_fused` does). No
// fallback is counted here: the plain path counts the call's own outcome.
bool run_bias(Slot& s, int si, const View& a, const View& b, const View& bias,
              StableIValue* bias_box, const Operands& o, int dev, int32_t dtype,
              StableIValue* stack) {
  if (bias.strides[0] != 1 && o.n != 1) return false;  // the kernel reads bias[n]
  ShapeKey key{{dev, dtype, o.layout, o.m, o.n, o.k, o.lda, o.ldb, E_BIAS}};
  int32_t plan_id = lookup(s, si, key, dtype, o, dev);
  if (plan_id < 0) return false;
  PlanDesc p{};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (plan_id >= static_cast<int32_t>(s.plans.size()) || s.dead[plan_id]) return false;
    p = s.plans[plan_id];
  }
  // Only the kernel of the epilogue asked for (`prepare` answers no other; kept so)
  if (!(p.kind == 1 && p.abi == 3 && p.epilogue == E_BIAS)) return false;
  EpiArgs epi;
  epi.bias = reinterpret_cast<uint64_t>(bias.data);
  epi.ldc = o.n;
  AtenTensorHandle out = new_output(true, a, o);
  void* c = nullptr;
  aoti_torch_get_data_ptr(out, &c);
  CUresult r;
  {
    CtxGuard guard(dev);
    r = guard.status;
    void* stream = nullptr;
    if (r == CUDA_SUCCESS && current_stream(dev, &stream) != AOTI_TORCH_SUCCESS) {
      r = CUDA_ERROR_INVALID_HANDLE;
    }
    if (r == CUDA_SUCCESS) {
      r = launch_kernel(p, reinterpret_cast<uint64_t>(a.data), reinterpret_cast<uint64_t>(b.data),
                        reinterpret_cast<uint64_t>(c), o, static_cast<CUstream>(stream), &epi);
    }
  }
  if (r != CUDA_SUCCESS) {
    aoti_torch_delete_tensor_object(out);
    const char* name = nullptr;
    drv.error_name(r, &name);
    std::string message = std::string("the launch failed: ") + (name ? name : "?");
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.dead[plan_id] = 1;
    }
    s.event(si, plan_id, R_LAUNCH_ERROR, message.c_str());
    return false;
  }
  s.hits[plan_id].fetch_add(1, std::memory_order_relaxed);
  // The boxed convention: the kernel owns its inputs and leaves its output in stack[0].
  aoti_torch_delete_tensor_object(a.h);
  aoti_torch_delete_tensor_object(b.h);
  aoti_torch_delete_tensor_object(bias.h);
  delete bias_box;  // torch 2.11 boxes an optional's value with new StableIValue
  stack[0] = reinterpret_cast<StableIValue>(out);
  return true;
}

// One call of `linear` (is_linear) or `matmul` on slot si. Stack: x, w[, bias?].
void run(int si, bool is_linear, StableIValue* stack) {
  Slot& s = slots[si];
  const char* aten = is_linear ? "aten::linear" : "aten::matmul";
  const char* what = is_linear ? "linear" : "matmul";
  if (env_is("CUDAL2_NATIVE", "0")) {  // counted by the Python path itself
    redispatch(is_linear ? s.linear_py.c_str() : s.matmul_py.c_str(), stack, what);
    return;
  }
  int reason = -1;
  View a, b, bias;
  Operands o{};
  StableIValue* bias_box = is_linear ? reinterpret_cast<StableIValue*>(stack[2]) : nullptr;
  if (env_is("CUDAL2_DISABLE", "1")) {
    reason = R_DISABLED;
  } else if (!read(reinterpret_cast<AtenTensorHandle>(stack[0]), &a) ||
             !read(reinterpret_cast<AtenTensorHandle>(stack[1]), &b)) {
    reason = R_NOT_STRIDED;
  } else if (a.dtype != b.dtype || (a.dtype != kHalf && a.dtype != kBFloat16)) {
    reason = R_DTYPE;
  } else {
    reason = is_linear ? linear_operands(a.sizes, a.strides, a.ndim, b.sizes, b.strides, b.ndim, &o)
                       : matmul_operands(a.sizes, a.strides, a.ndim, b.sizes, b.strides, b.ndim, &o);
  }
  if (reason < 0 && bias_box != nullptr) {
    if (!read(reinterpret_cast<AtenTensorHandle>(*bias_box), &bias) || bias.dtype != a.dtype ||
        bias.ndim != 1 || bias.sizes[0] != o.n || bias.device_type != a.device_type ||
        bias.device_index != a.device_index) {
      reason = R_BIAS;
    }
  }
  if (reason < 0) {
    if (a.device_type != kCuda || b.device_type != kCuda || a.device_index != b.device_index) {
      reason = R_DEVICE;
    } else if ((reinterpret_cast<uintptr_t>(a.data) | reinterpret_cast<uintptr_t>(b.data)) % 16) {
      reason = R_ALIGNMENT;
    }
  }
  // From here on the inputs are well-formed CUDA GEMM operands (o holds them): a call
  // that does not run a kernel can run torch's cuBLAS GEMM directly (`torch_gemm`).
  int32_t plan_id = -1;
  int dev = a.device_index;
  int32_t dtype = a.dtype == kHalf ? 0 : 1;
  // A bias: the table's fused-bias kernel for this shape first, as `Api._linear` tries it
  if (reason < 0 && bias_box != nullptr &&
      run_bias(s, si, a, b, bias, bias_box, o, dev, dtype, stack)) {
    return;
  }
  if (reason < 0) {
    ShapeKey key{{dev, dtype, o.layout, o.m, o.n, o.k, o.lda, o.ldb, E_NONE}};
    int32_t got = lookup(s, si, key, dtype, o, dev);
    if (got < 0) {
      reason = -got - 1;
    } else {
      plan_id = got;
    }
  }
  PlanDesc p{};
  if (reason < 0) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (plan_id >= static_cast<int32_t>(s.plans.size()) || s.dead[plan_id]) {
      reason = R_LAUNCH_ERROR;
    } else {
      p = s.plans[plan_id];
    }
  }
  // Eagerly, an entry's eager alternative runs in its place (cheaper to launch); under
  // capture only GPU time counts, and the entry's own choice runs.
  if (reason < 0 && p.eager > 0 && !capturing(dev)) {
    std::lock_guard<std::mutex> lock(s.mu);
    int32_t alt = p.eager - 1;
    if (alt < static_cast<int32_t>(s.plans.size()) && !s.dead[alt]) {
      plan_id = alt;
      p = s.plans[alt];
    }
  }
  if (reason < 0 && p.kind == 0) reason = R_FALLBACK_ENTRY;  // torch's GEMM, as the table says
  if (reason < 0 && bias_box != nullptr && p.bias_function == 0) reason = R_BIAS;
  if (reason >= 0) {
    s.fallbacks[reason].fetch_add(1, std::memory_order_relaxed);
    bool operands_ok = reason == R_ALIGNMENT || reason >= R_LAUNCH_ERROR;
    if (!(operands_ok && torch_gemm(is_linear, a, b, bias_box ? &bias : nullptr, o, stack))) {
      redispatch(aten, stack, what);
    }
    return;
  }

  AtenTensorHandle out = new_output(is_linear, a, o);
  void* c = nullptr;
  aoti_torch_get_data_ptr(out, &c);
  void* stream_ptr = nullptr;
  CUresult r = CUDA_SUCCESS;
  std::string message;
  {
    CtxGuard guard(dev);
    r = guard.status;
    if (r == CUDA_SUCCESS && current_stream(dev, &stream_ptr) != AOTI_TORCH_SUCCESS) {
      r = CUDA_ERROR_INVALID_HANDLE;
    }
    CUstream stream = static_cast<CUstream>(stream_ptr);
    uint64_t ua = reinterpret_cast<uint64_t>(a.data), ub = reinterpret_cast<uint64_t>(b.data),
             uc = reinterpret_cast<uint64_t>(c);
    if (r == CUDA_SUCCESS && p.kind == 1) {
      r = launch_kernel(p, ua, ub, uc, o, stream);
    } else if (r == CUDA_SUCCESS) {  // cuBLASLt: C^T = op(W) . A^T (see _runtime/cublaslt.py)
      uint64_t wkey = (static_cast<uint64_t>(dev) << 48) ^ reinterpret_cast<uint64_t>(stream_ptr);
      std::pair<uint64_t, uint64_t> ws{0, 0};
      bool have = false;
      {
        std::lock_guard<std::mutex> lock(s.mu);
        auto it = s.workspaces.find(wkey);
        if (it != s.workspaces.end()) {
          ws = it->second;
          have = true;
        }
      }
      if (!have) {
        if (s.workspace(si, dev, reinterpret_cast<uint64_t>(stream_ptr), &ws.first, &ws.second) !=
            0) {
          reason = R_CUBLASLT_ALGO;
        } else {
          std::lock_guard<std::mutex> lock(s.mu);
          s.workspaces[wkey] = ws;
        }
      }
      if (reason < 0 && p.lt_workspace_bytes > ws.second) reason = R_CUBLASLT_ALGO;
      if (reason < 0) {
        auto matmul = reinterpret_cast<LtMatmulFn>(p.lt_matmul);
        int status = matmul(
            reinterpret_cast<void*>(p.lt_handle), reinterpret_cast<void*>(p.lt_desc),
            reinterpret_cast<void*>(p.lt_alpha), b.data, reinterpret_cast<void*>(p.lt_w), a.data,
            reinterpret_cast<void*>(p.lt_a), reinterpret_cast<void*>(p.lt_beta), c,
            reinterpret_cast<void*>(p.lt_c), c, reinterpret_cast<void*>(p.lt_c),
            reinterpret_cast<void*>(p.lt_algo), reinterpret_cast<void*>(ws.first), ws.second,
            stream);
        if (status != 0) {
          r = CUDA_ERROR_UNKNOWN;
          message = "cublasLtMatmul returned status " + std::to_string(status);
        }
      }
    }
    if (r == CUDA_SUCCESS && reason < 0 && bias_box != nullptr) {
      r = launch_bias(p.bias_function, uc, bias, o, stream);
    }
  }
  if (r != CUDA_SUCCESS || reason >= 0) {
    aoti_torch_delete_tensor_object(out);
    if (r != CUDA_SUCCESS) {
      reason = R_LAUNCH_ERROR;
      if (message.empty()) {
        const char* name = nullptr;
        drv.error_name(r, &name);
        message = std::string("the launch failed: ") + (name ? name : "?");
      }
      {
        std::lock_guard<std::mutex> lock(s.mu);
        s.dead[plan_id] = 1;
      }
      s.event(si, plan_id, R_LAUNCH_ERROR, message.c_str());
    }
    s.fallbacks[reason].fetch_add(1, std::memory_order_relaxed);
    if (!torch_gemm(is_linear, a, b, bias_box ? &bias : nullptr, o, stack)) {
      redispatch(aten, stack, what);
    }
    return;
  }
  s.hits[plan_id].fetch_add(1, std::memory_order_relaxed);
  // The boxed convention: the kernel owns its inputs and leaves its output in stack[0].
  aoti_torch_delete_tensor_object(a.h);
  aoti_torch_delete_tensor_object(b.h);
  if (bias_box != nullptr) {
    aoti_torch_delete_tensor_object(bias.h);
    delete bias_box;  // torch 2.11 boxes an optional's value with new StableIValue
  }
  stack[0] = reinterpret_cast<StableIValue>(out);
}


// ---- the fused ops (ABI gemm_v3) ----------------------------------------------------
struct FusedCall {
  Operands o{};
  int32_t epilogue = E_NONE;
  EpiArgs epi;
};
// `fused_operands`' answer where the op's Python kernel raises (an unknown act, an eps
// that is not finite): no fallback reason, an error.
constexpr int kRaises = kNumReasons;

// Whether a fused op's call can run a gemm_v3 kernel, checked as the Python path checks
// it (`Api._linear_residual` / `_fused_call`, `_residual_ld`, `fused.check_*`), in its
// order: -1 with `f` filled (the operands, the epilogue the table is asked for, the
// kernel's epilogue operands), or the reason Python finds first (kRaises where it
// raises). Stricter than Python nowhere it matters: a call declined here goes to the
// op's Python kernel, never to a wrong answer. `act`: 0 silu, 1 gelu_tanh, -1 another
// string (gated only); `bias` / `residual` null where absent.
int fused_operands(int op, const View& x, const View& w, const View* bias, const View* residual,
                   int act, bool has_eps, double eps, FusedCall* f) {
  if (op == F_GATED && act < 0) return kRaises;
  if ((op == F_RMSNORM || has_eps) && !std::isfinite(eps)) return kRaises;
  if (x.dtype != w.dtype || (x.dtype != kHalf && x.dtype != kBFloat16)) return R_DTYPE;
  int r = linear_operands(x.sizes, x.strides, x.ndim, w.sizes, w.strides, w.ndim, &f->o);
  if (r >= 0) return r;
  const Operands& o = f->o;
  if (bias != nullptr) {
    // `_bias_reason`, and a unit stride: the kernel reads bias[n] (a strided bias is
    // added by torch instead)
    if (bias->dtype != x.dtype || bias->ndim != 1 || bias->sizes[0] != o.n ||
        bias->device_type != x.device_type || bias->device_index != x.device_index ||
        (bias->strides[0] != 1 && o.n != 1)) {
      return R_BIAS;
    }
  }
  if (residual != nullptr) {  // `_residual_ld`: the output's shape, one row stride
    const View& rv = *residual;
    bool same = rv.dtype == x.dtype && rv.device_type == x.device_type &&
                rv.device_index == x.device_index && rv.ndim == x.ndim;
    for (int64_t i = 0; same && i + 1 < x.ndim; ++i) same = rv.sizes[i] == x.sizes[i];
    if (!same || rv.sizes[rv.ndim - 1] != o.n) return R_RESIDUAL;
    if (rv.ndim == 2 && rv.strides[1] == 1 && rv.strides[0] >= o.n) {
      f->epi.ldr = rv.strides[0];
    } else if (contiguous(rv)) {
      f->epi.ldr = o.n;
    } else {
      return R_RESIDUAL;
    }
    f->epi.residual = reinterpret_cast<uint64_t>(rv.data);
  }
  if (op == F_RESIDUAL) {
    f->epilogue = bias != nullptr ? E_BIAS_RESIDUAL : E_RESIDUAL;
  } else if (op == F_GATED) {
    f->epilogue = (has_eps ? E_RMSNORM_SILU : E_SILU) + act;
  } else {
    f->epilogue = bias != nullptr ? E_RMSNORM_BIAS : E_RMSNORM;
  }
  f->epi.ldc = gated(f->epilogue) ? o.n / 2 : o.n;
  if (f->epi.ldc % 8) return R_STRIDE;  // the ABI's ldc rule (`_fused_call`)
  // `_run`: the pointers, then the devices
  if ((reinterpret_cast<uintptr_t>(x.data) | reinterpret_cast<uintptr_t>(w.data)) % 16) {
    return R_ALIGNMENT;
  }
  if (x.device_type != kCuda || w.device_type != kCuda || x.device_index != w.device_index) {
    return R_DEVICE;
  }
  if (bias != nullptr) f->epi.bias = reinterpret_cast<uint64_t>(bias->data);
  f->epi.eps = row_scaled(f->epilogue) ? static_cast<float>(eps) : 0.0f;
  return -1;
}

// A gated op's `act` (the boxed string, borrowed): 0 silu, 1 gelu_tanh, -1 another.
int act_code(StableIValue v) {
  size_t len = 0;
  const char* data = nullptr;
  auto h = reinterpret_cast<StringHandle>(v);
  if (h == nullptr || torch_string_length(h, &len) != AOTI_TORCH_SUCCESS ||
      torch_string_c_str(h, &data) != AOTI_TORCH_SUCCESS) {
    return -1;
  }
  std::string act(data, len);
  return act == "silu" ? 0 : act == "gelu_tanh" ? 1 : -1;
}

double as_double(StableIValue v) {
  double d;
  std::memcpy(&d, &v, sizeof d);
  return d;
}

// One call of a fused op on slot si. Stack: x, w, then the op's (see `FusedOp`). A call
// whose inputs or plan the kernel does not take goes, untouched, to the op's Python
// kernel (`<ns>::_<op>_py`): it raises the Python path's error (as a RuntimeError with
// its message, through the dispatcher) or falls back and counts its reason; launched
// here, it counts a hit.
void run_fused(int si, int op, StableIValue* stack) {
  Slot& s = slots[si];
  const char* py = s.fused_py[op].c_str();
  const char* what = kFusedNames[op];
  if (env_is("CUDAL2_NATIVE", "0") || env_is("CUDAL2_DISABLE", "1")) {
    redispatch(py, stack, what);
    return;
  }
  View x, w, bias, residual;
  StableIValue* bias_box = nullptr;  // an optional's value is boxed (torch 2.11)
  StableIValue* eps_box = nullptr;
  int act = 0;
  bool has_eps = false;
  double eps = 0.0;
  bool ok = read(reinterpret_cast<AtenTensorHandle>(stack[0]), &x) &&
            read(reinterpret_cast<AtenTensorHandle>(stack[1]), &w);
  if (op == F_RESIDUAL) {
    ok = ok && read(reinterpret_cast<AtenTensorHandle>(stack[2]), &residual);
    bias_box = reinterpret_cast<StableIValue*>(stack[3]);
  } else if (op == F_GATED) {
    act = act_code(stack[2]);
    eps_box = reinterpret_cast<StableIValue*>(stack[3]);
    has_eps = eps_box != nullptr;
    if (has_eps) eps = as_double(*eps_box);
  } else {
    has_eps = true;
    eps = as_double(stack[2]);
    bias_box = reinterpret_cast<StableIValue*>(stack[3]);
  }
  ok = ok && (bias_box == nullptr || read(reinterpret_cast<AtenTensorHandle>(*bias_box), &bias));
  FusedCall f;
  ok = ok && fused_operands(op, x, w, bias_box ? &bias : nullptr,
                            op == F_RESIDUAL ? &residual : nullptr, act, has_eps, eps, &f) < 0;
  int dev = x.device_index;
  int32_t dtype = x.dtype == kHalf ? 0 : 1;
  int32_t plan_id = -1;
  PlanDesc p{};
  if (ok) {
    const Operands& o = f.o;
    ShapeKey key{{dev, dtype, o.layout, o.m, o.n, o.k, o.lda, o.ldb, f.epilogue}};
    plan_id = lookup(s, si, key, dtype, o, dev);
    ok = plan_id >= 0;
  }
  if (ok) {
    std::lock_guard<std::mutex> lock(s.mu);
    ok = plan_id < static_cast<int32_t>(s.plans.size()) && !s.dead[plan_id];
    if (ok) p = s.plans[plan_id];
  }
  // Only the kernel of the epilogue asked for (`prepare` answers no other; kept so); one
  // that reads R by TMA only where R is 16-byte aligned with ldr % 8 == 0 (the map's
  // rule; the Python kernel falls back for the rest, reason `alignment`)
  ok = ok && p.kind == 1 && p.abi == 3 && p.epilogue == f.epilogue;
  ok = ok && (!p.tma_r || (f.epi.residual % 16 == 0 && f.epi.ldr % 8 == 0));
  if (!ok) {
    redispatch(py, stack, what);
    return;
  }
  AtenTensorHandle out = new_output(true, x, f.o, f.epi.ldc);
  void* c = nullptr;
  aoti_torch_get_data_ptr(out, &c);
  CUresult r;
  {
    CtxGuard guard(dev);
    r = guard.status;
    void* stream = nullptr;
    if (r == CUDA_SUCCESS && current_stream(dev, &stream) != AOTI_TORCH_SUCCESS) {
      r = CUDA_ERROR_INVALID_HANDLE;
    }
    if (r == CUDA_SUCCESS) {
      r = launch_kernel(p, reinterpret_cast<uint64_t>(x.data), reinterpret_cast<uint64_t>(w.data),
                        reinterpret_cast<uint64_t>(c), f.o, static_cast<CUstream>(stream), &f.epi);
    }
  }
  if (r != CUDA_SUCCESS) {
    aoti_torch_delete_tensor_object(out);
    const char* name = nullptr;
    drv.error_name(r, &name);
    std::string message = std::string("the launch failed: ") + (name ? name : "?");
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.dead[plan_id] = 1;
    }
    s.event(si, plan_id, R_LAUNCH_ERROR, message.c_str());  // the Python plan's reason too
    redispatch(py, stack, what);
    return;
  }
  s.hits[plan_id].fetch_add(1, std::memory_order_relaxed);
  // The boxed convention: the kernel owns its inputs and leaves its output in stack[0].
  aoti_torch_delete_tensor_object(x.h);
  aoti_torch_delete_tensor_object(w.h);
  if (op == F_RESIDUAL) aoti_torch_delete_tensor_object(residual.h);
  if (op == F_GATED) torch_delete_string(reinterpret_cast<StringHandle>(stack[2]));
  if (bias_box != nullptr) {
    aoti_torch_delete_tensor_object(bias.h);
    delete bias_box;  // torch 2.11 boxes an optional's value with new StableIValue
  }
  delete eps_box;
  stack[0] = reinterpret_cast<StableIValue>(out);
}

template <int S>
void linear_boxed(StableIValue* stack, uint64_t, uint64_t) {
  run(S, true, stack);
}
template <int S>
void matmul_boxed(StableIValue* stack, uint64_t, uint64_t) {
  run(S, false, stack);
}
template <int S, int Op>
void fused_boxed(StableIValue* stack, uint64_t, uint64_t) {
  run_fused(S, Op, stack);
}
using Boxed = void (*)(StableIValue*, uint64_t, uint64_t);
template <int... S>
struct Table {
  static constexpr Boxed linear[] = {&linear_boxed<S>...};
  static constexpr Boxed matmul[] = {&matmul_boxed<S>...};
  static constexpr Boxed fused[kNumFused][kSlots] = {{&fused_boxed<S, F_RESIDUAL>...},
                                                     {&fused_boxed<S, F_GATED>...},
                                                     {&fused_boxed<S, F_RMSNORM>...}};
};
using Slots = Table<0, 1, 2, 3, 4, 5, 6, 7>;
static_assert(sizeof(Slots::linear) / sizeof(Boxed) == kSlots, "one boxed kernel per slot");

template <class F>
bool sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

CUDAL2_EXPORT int cudal2_native_abi(void) { return kAbi; }

CUDAL2_EXPORT int cudal2_native_num_reasons(void) { return kNumReasons; }

CUDAL2_EXPORT const char* cudal2_native_reason(int i) {
  return i >= 0 && i < kNumReasons ? kReasons[i] : nullptr;
}

CUDAL2_EXPORT int cudal2_native_num_epilogues(void) { return kNumEpilogues; }

CUDAL2_EXPORT const char* cudal2_native_epilogue(int i) {
  return i >= 0 && i < kNumEpilogues ? kEpilogues[i] : nullptr;
}

CUDAL2_EXPORT int cudal2_native_max_plans(void) { return kMaxPlans; }

CUDAL2_EXPORT int cudal2_native_plan_bytes(void) { return sizeof(PlanDesc); }

// The grid a plan launches for an M x N output (x, y, z into out[0..2]): the tests
// check it against driver.gemm_grid's on a machine without a GPU.
CUDAL2_EXPORT void cudal2_native_grid(const PlanDesc* plan, int64_t m, int64_t n, int64_t* out) {
  unsigned grid[3];
  kernel_grid(*plan, m, n, grid);
  for (int i = 0; i < 3; ++i) out[i] = grid[i];
}

// The offsets of PlanDesc's fields, in declaration order, into out[n]: how many there are
// (native.py checks its ctypes mirror field for field at load).
#define CUDAL2_PLAN_FIELDS(X)                                                              \
  X(kind) X(abi) X(function) X(block) X(smem) X(tile_m) X(tile_n) X(split_k) X(cluster)      \
  X(persistent) X(ctas_per_sm) X(sm_count) X(box_a) X(box_b) X(box_c) X(pdl) X(eager)       \
  X(lt_matmul) X(lt_handle) X(lt_desc) X(lt_w) X(lt_a) X(lt_c) X(lt_algo) X(lt_alpha)        \
  X(lt_beta) X(lt_workspace_bytes) X(bias_function) X(epilogue) X(tma_r)
#define CUDAL2_OFFSET(f) offsetof(PlanDesc, f),
CUDAL2_EXPORT int cudal2_native_plan_offsets(int64_t* out, int n) {
  const int64_t offsets[] = {CUDAL2_PLAN_FIELDS(CUDAL2_OFFSET)};
  const int count = sizeof offsets / sizeof offsets[0];
  for (int i = 0; i < n && i < count; ++i) out[i] = offsets[i];
  return count;
}

// Look up the driver and torch's CUDA stream function. 0, or writes why not into err.
CUDAL2_EXPORT int cudal2_native_init(char* err, int err_len) {
  std::lock_guard<std::mutex> lock(init_mu);
  if (initialised) return 0;
  auto why = [&](const std::string& s) {
    std::snprintf(err, static_cast<size_t>(err_len), "%s", s.c_str());
    return 1;
  };
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cuda == nullptr) return why(std::string("cannot load libcuda.so.1: ") + dlerror());
  if (!sym(cuda, "cuLaunchKernelEx", &drv.launch) ||
      !sym(cuda, "cuTensorMapEncodeTiled", &drv.encode) ||
      !sym(cuda, "cuCtxGetCurrent", &drv.ctx_current) ||
      !sym(cuda, "cuCtxPushCurrent_v2", &drv.ctx_push) ||
      !sym(cuda, "cuCtxPopCurrent_v2", &drv.ctx_pop) ||
      !sym(cuda, "cuDevicePrimaryCtxRetain", &drv.primary_retain) ||
      !sym(cuda, "cuDeviceGet", &drv.device_get) ||
      !sym(cuda, "cuGetErrorName", &drv.error_name) ||
      !sym(cuda, "cuStreamIsCapturing", &drv.is_capturing)) {
    return why("libcuda.so.1 lacks a function the launcher needs (a driver older than CUDA 12)");
  }
  void* torch_cuda = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
  if (torch_cuda == nullptr || !sym(torch_cuda, "aoti_torch_get_current_cuda_stream",
                                    &current_stream)) {
    return why("torch's CUDA library (libtorch_cuda.so) is not loaded: a CPU build of torch");
  }
  if (!sym(torch_cuda, "aoti_torch_cuda_mm_out", &mm_out) ||
      !sym(torch_cuda, "aoti_torch_cuda_addmm_out", &addmm_out)) {
    mm_out = nullptr;
    addmm_out = nullptr;
  }
  void* torch_cpu = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  if (torch_cpu != nullptr) {
    sym(torch_cpu, "torch_exception_get_what_without_backtrace", &exception_what);
  }
  initialised = true;
  return 0;
}

// Register the CUDA kernels of <ns>::linear, ::matmul, ::linear_residual, ::linear_gated and
// ::linear_rmsnorm (defined by Python first, with `_linear_py`, `_matmul_py` and
// `_<fused op>_py`, the Python kernels). The slot, or -1 with err set.
CUDAL2_EXPORT int cudal2_native_register(const char* ns, PrepareFn prepare, WorkspaceFn workspace,
                                         EventFn event, char* err, int err_len) {
  std::lock_guard<std::mutex> lock(init_mu);
  int si = 0;
  while (si < kSlots && slots[si].used) ++si;
  if (si == kSlots) {
    std::snprintf(err, static_cast<size_t>(err_len), "all %d op namespaces are taken", kSlots);
    return -1;
  }
  Slot& s = slots[si];
  s.ns = ns;
  s.linear_py = s.ns + "::_linear_py";
  s.matmul_py = s.ns + "::_matmul_py";
  for (int op = 0; op < kNumFused; ++op) {
    s.fused_ops[op] = kFusedNames[op];
    s.fused_py[op] = s.ns + "::_" + kFusedNames[op] + "_py";
  }
  s.prepare = prepare;
  s.workspace = workspace;
  s.event = event;
  s.plans.assign(0, PlanDesc{});
  s.dead.assign(0, 0);
  for (auto& h : s.hits) h.store(0);
  for (auto& f : s.fallbacks) f.store(0);
  if (aoti_torch_library_init_impl(s.ns.c_str(), "CUDA", __FILE__, __LINE__, &s.lib) !=
          AOTI_TORCH_SUCCESS ||
      torch_library_impl(s.lib, "linear", Slots::linear[si], TORCH_ABI_VERSION) !=
          AOTI_TORCH_SUCCESS ||
      torch_library_impl(s.lib, "matmul", Slots::matmul[si], TORCH_ABI_VERSION) !=
          AOTI_TORCH_SUCCESS) {
    std::snprintf(err, static_cast<size_t>(err_len),
                  "torch refused the CUDA kernels of %s::linear/matmul", ns);
    return -1;
  }
  for (int op = 0; op < kNumFused; ++op) {
    if (torch_library_impl(s.lib, s.fused_ops[op].c_str(), Slots::fused[op][si],
                           TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) {
      std::snprintf(err, static_cast<size_t>(err_len), "torch refused the CUDA kernel of %s::%s",
                    ns, kFusedNames[op]);
      return -1;
    }
  }
  s.used = true;
  return si;
}

// Plan `id` of a slot (ids are Python's, dense from 0). 0, or -1 past kMaxPlans.
CUDAL2_EXPORT int cudal2_native_set_plan(int si, int id, const PlanDesc* plan) {
  if (si < 0 || si >= kSlots || id < 0 || id >= kMaxPlans) return -1;
  Slot& s = slots[si];
  std::lock_guard<std::mutex> lock(s.mu);
  if (static_cast<size_t>(id) >= s.plans.size()) {
    s.plans.resize(id + 1);
    s.dead.resize(id + 1, 0);
  }
  s.plans[id] = *plan;
  s.dead[id] = 0;
  return 0;
}

// A copy of plan `id` of a slot (tests: what Python's plan record became). 0, or -1.
CUDAL2_EXPORT int cudal2_native_get_plan(int si, int id, PlanDesc* out) {
  if (si < 0 || si >= kSlots) return -1;
  Slot& s = slots[si];
  std::lock_guard<std::mutex> lock(s.mu);
  if (id < 0 || static_cast<size_t>(id) >= s.plans.size()) return -1;
  *out = s.plans[id];
  return 0;
}

// Forget every remembered shape, plan and workspace of a slot (its Api was re-bound).
CUDAL2_EXPORT void cudal2_native_forget(int si) {
  if (si < 0 || si >= kSlots) return;
  Slot& s = slots[si];
  std::lock_guard<std::mutex> lock(s.mu);
  s.ready.clear();
  s.plans.clear();
  s.dead.clear();
  s.workspaces.clear();
}

// Move the counters out: hits[n_plans], fallbacks[kNumReasons], then zero them.
CUDAL2_EXPORT void cudal2_native_drain(int si, int64_t* hits, int n_plans, int64_t* fallbacks) {
  if (si < 0 || si >= kSlots) return;
  Slot& s = slots[si];
  for (int i = 0; i < n_plans && i < kMaxPlans; ++i) hits[i] = s.hits[i].exchange(0);
  for (int i = 0; i < kNumReasons; ++i) fallbacks[i] = s.fallbacks[i].exchange(0);
}

// The ABI's operand rules on plain arrays, for tests against `_runtime/abi.py`: -1 and
// the operands (layout, m, n, k, lda, ldb) in out[6], or the reason's index.
CUDAL2_EXPORT int cudal2_native_operands(int is_linear, const int64_t* sa, const int64_t* ta,
                                         int64_t na, const int64_t* sb, const int64_t* tb,
                                         int64_t nb, int64_t* out) {
  Operands o{};
  int r = is_linear ? linear_operands(sa, ta, na, sb, tb, nb, &o)
                    : matmul_operands(sa, ta, na, sb, tb, nb, &o);
  if (r < 0) {
    int64_t v[6] = {o.layout, o.m, o.n, o.k, o.lda, o.ldb};
    std::memcpy(out, v, sizeof v);
  }
  return r;
}

// The floor the native path is measured against (bench/experiments/host_overhead.py):
// `count` launches of a kernel plan through cuLaunchKernelEx from C, arguments and tensor
// maps made as a call makes them, on `stream`. CUDA_SUCCESS (0) or the driver's error.
CUDAL2_EXPORT int cudal2_native_launch_loop(int si, int plan_id, uint64_t a, uint64_t b,
                                            uint64_t c, int64_t m, int64_t n, int64_t k,
                                            int64_t lda, int64_t ldb, uint64_t stream,
                                            int count) {
  if (si < 0 || si >= kSlots || !initialised) return CUDA_ERROR_INVALID_VALUE;
  Slot& s = slots[si];
  PlanDesc p{};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (plan_id < 0 || static_cast<size_t>(plan_id) >= s.plans.size()) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    p = s.plans[plan_id];
  }
  if (p.kind != 1) return CUDA_ERROR_INVALID_VALUE;
  Operands o{0, m, n, k, lda, ldb};
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < count && r == CUDA_SUCCESS; ++i) {
    r = launch_kernel(p, a, b, c, o, reinterpret_cast<CUstream>(stream));
  }
  return r;
}

// A tensor as `cudal2_native_fused_operands` takes it (tests: no torch tensor needed).
struct TensorArg {
  int64_t ndim;
  const int64_t* sizes;
  const int64_t* strides;
  int32_t dtype, device_type, device_index, present;  // present 0: an absent optional
  uint64_t data;
};

// A fused op's checks on plain arrays, for tests against the Python path: -1 and, in
// out[10], (layout, m, n, k, lda, ldb, epilogue, ldr, ldc, has bias) and the eps the
// kernel gets in *eps_out; or the reason's index (num_reasons: the Python kernel raises).
// `op`: 0 linear_residual, 1 linear_gated, 2 linear_rmsnorm; `act` a C string or null.
CUDAL2_EXPORT int cudal2_native_fused_operands(int op, const TensorArg* x, const TensorArg* w,
                                               const TensorArg* bias, const TensorArg* residual,
                                               const char* act, int has_eps, double eps,
                                               int64_t* out, float* eps_out) {
  if (op < 0 || op >= kNumFused) return kRaises;
  auto view = [](const TensorArg* t, View* v) {
    v->ndim = t->ndim;
    v->sizes = const_cast<int64_t*>(t->sizes);
    v->strides = const_cast<int64_t*>(t->strides);
    v->dtype = t->dtype;
    v->device_type = t->device_type;
    v->device_index = t->device_index;
    v->layout = kStrided;
    v->data = reinterpret_cast<void*>(t->data);
  };
  View vx, vw, vb, vr;
  view(x, &vx);
  view(w, &vw);
  bool has_bias = bias != nullptr && bias->present;
  if (has_bias) view(bias, &vb);
  if (op == F_RESIDUAL) view(residual, &vr);
  int code = act == nullptr ? -1 : std::strcmp(act, "silu") == 0 ? 0
                                  : std::strcmp(act, "gelu_tanh") == 0 ? 1 : -1;
  FusedCall f;
  int r = fused_operands(op, vx, vw, has_bias ? &vb : nullptr, op == F_RESIDUAL ? &vr : nullptr,
                         code, has_eps != 0 || op == F_RMSNORM, eps, &f);
  if (r < 0) {
    int64_t v[10] = {f.o.layout, f.o.m,       f.o.n,      f.o.k,      f.o.lda,
                     f.o.ldb,    f.epilogue, f.epi.ldr, f.epi.ldc, f.epi.bias != 0};
    std::memcpy(out, v, sizeof v);
    *eps_out = f.epi.eps;
  }
  return r;
}
