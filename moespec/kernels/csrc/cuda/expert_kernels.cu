// expert_kernels.cu: the C launch API (moespec_cuda.h) of moespec's CUDA expert kernels: argument
// checks, workspace layout, the choice between the legacy three-launch path (legacy_kernels.cuh)
// and the fused two-launch path (fused_kernels.cuh), launch shapes, and the launches. Plain
// CUDA C++: no torch headers.
#include "moespec_cuda.h"
#include "expert_common.cuh"
#include "expert_params.cuh"
#include "legacy_kernels.cuh"
#include "fused_kernels.cuh"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <mutex>
#include <utility>

namespace moespec_cuda {

// ---- host side ----------------------------------------------------------------------------
constexpr size_t kAlign = 256;
constexpr size_t kStaticSmemReserve = 1024;  // Tile, flags and compiler-reserved static shared memory
inline size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int check_args(const moespec_expert_args* a, int kernel) {
  if (!a) return MOESPEC_ERR_NULL;
  if (kernel != MOESPEC_SLOT && kernel != MOESPEC_DEDUP) return MOESPEC_ERR_FORMAT;
  if (a->w_fmt < MOESPEC_W_F32 || a->w_fmt > MOESPEC_W_I8B32) return MOESPEC_ERR_FORMAT;
  if (a->n < 0 || a->m < 1 || a->N < 1 || a->H < 1 || a->I < 1) return MOESPEC_ERR_SHAPE;
  if ((long long)a->n * a->m > INT_MAX / 2) return MOESPEC_ERR_SHAPE;
  if (a->w_fmt == MOESPEC_W_I8B32 && (a->H % kQBlock || a->I % kQBlock)) return MOESPEC_ERR_INT8_SHAPE;
  if ((a->I + kGuRowsPerIter - 1) / kGuRowsPerIter > 65535 ||
      (a->H + kDownRowsPerIter - 1) / kDownRowsPerIter > 65535)
    return MOESPEC_ERR_GRID;
  return MOESPEC_OK;
}

// ---- tuning: process-wide launch choices ---------------------------------------------------
moespec_cuda_tuning tuning_from_env() {
  moespec_cuda_tuning t{};
  t.pdl = -1;
  const char* path = getenv("MOESPEC_CUDA_PATH");
  if (path && !strcmp(path, "legacy")) t.path = MOESPEC_PATH_LEGACY;
  if (path && !strcmp(path, "fused")) t.path = MOESPEC_PATH_FUSED;
  const char* pdl = getenv("MOESPEC_CUDA_PDL");
  if (pdl && !strcmp(pdl, "0")) t.pdl = 0;
  if (pdl && !strcmp(pdl, "1")) t.pdl = 1;
  return t;
}

moespec_cuda_tuning& tuning() {
  static moespec_cuda_tuning t = tuning_from_env();
  return t;
}

bool tuning_valid(const moespec_cuda_tuning& t) {
  auto in = [](int v, int lo, int hi) { return v == 0 || (v >= lo && v <= hi); };
  return t.path >= MOESPEC_PATH_AUTO && t.path <= MOESPEC_PATH_FUSED && t.pdl >= -1 && t.pdl <= 1 &&
         in(t.ring_gu, 2, 8) && in(t.ring_dn, 2, 8) && in(t.dn_warps, 1, kMaxDnWarps) && in(t.gu_blocks_per_sm, 1, 64);
}

// ---- what the device offers -------------------------------------------------------------
struct Device {
  int sms, cc_major, smem_optin, smem_per_sm;
};

int query_device(Device* d) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&d->sms, cudaDevAttrMultiProcessorCount, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&d->cc_major, cudaDevAttrComputeCapabilityMajor, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&d->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&d->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  return (int)err;
}

// Shared-memory bytes one token's activations of length K take in format w_fmt (legacy staging).
size_t act_bytes_per_token(int w_fmt, int K) {
  switch (w_fmt) {
    case MOESPEC_W_F32: return act_smem_bytes<FmtF32>(1, K);
    case MOESPEC_W_BF16: return act_smem_bytes<FmtBF16>(1, K);
    default: return act_smem_bytes<FmtI8B32>(1, K);
  }
}

// Tokens per tile: 1 for per-slot; for dedup MOESPEC_TILE_MAX, fewer only where a full tile's
// activations (plus the expert histogram) would not fit in the device's shared memory.
int tile_size(const moespec_expert_args* a, int kernel, const Device& d, int* tile) {
  const size_t smem = (size_t)d.smem_optin > kStaticSmemReserve ? (size_t)d.smem_optin - kStaticSmemReserve : 0;
  const size_t hist = kernel == MOESPEC_DEDUP ? 4 * (size_t)a->N : 0;
  if (smem < hist) return MOESPEC_ERR_SMEM;
  size_t t = kernel == MOESPEC_DEDUP ? MOESPEC_TILE_MAX : 1;
  const size_t t_gu = (smem - hist) / act_bytes_per_token(a->w_fmt, a->H);
  const size_t t_dn = smem / act_bytes_per_token(a->w_fmt, a->I);
  if (t_gu < t) t = t_gu;
  if (t_dn < t) t = t_dn;
  if (t < 1) return MOESPEC_ERR_SMEM;
  *tile = (int)t;
  return MOESPEC_OK;
}

// Blocks along the tile axis: P pairs for per-slot; for dedup an upper bound on the tiles,
// sum_e ceil(c_e / tile) <= (P + U (tile - 1)) / tile with U <= min(N, P) distinct experts
// (blocks past the actual count exit at once).
size_t max_tiles(const moespec_expert_args* a, int kernel, int tile) {
  const size_t P = (size_t)a->n * a->m;
  if (kernel == MOESPEC_SLOT) return P;
  const size_t U = P < (size_t)a->N ? P : (size_t)a->N;
  const size_t bound = (P + U * (tile - 1)) / tile;
  return bound < P ? bound : P;
}

// Row iterations per block: every block stages (rounds / quantizes) its tile's activations once,
// so longer blocks amortize that; but the grid must keep every SM busy. Doubles the iterations
// while the grid still has at least min_blocks blocks per SM.
int row_iters(size_t tiles, int rows, int rows_per_iter, int sms, int min_blocks) {
  int r = 1;
  while (r < kMaxRowIters) {
    const size_t blocks = tiles * (size_t)((rows + rows_per_iter * 2 * r - 1) / (rows_per_iter * 2 * r));
    if (blocks < (size_t)min_blocks * sms) break;
    r *= 2;
  }
  return r;
}

struct Workspace {
  size_t h, o, tiles, flags, total;
};

// One layout serves both paths: h (legacy float32; fused the same bytes in the format's
// precision, never larger), o and the tile table (legacy), the non-finite flags (both).
Workspace layout(const moespec_expert_args* a, int kernel, int tile) {
  const size_t P = (size_t)a->n * a->m;
  Workspace w;
  w.h = 0;
  w.o = align_up(w.h + 4 * P * a->I);
  w.tiles = align_up(w.o + 4 * P * a->H);
  w.flags = align_up(w.tiles + 4 * (1 + max_tiles(a, kernel, tile) * kDescInts));
  w.total = align_up(w.flags + 4 * P);
  return w;
}

inline bool aligned16(const void* ptr) { return ((uintptr_t)ptr & 15u) == 0; }

// ---- the plan: path and launch shapes of one call -------------------------------------------
struct Plan {
  moespec_cuda_plan pub;
  size_t ntiles;
  bool vec_gu, vec_dn;
};

int elem_bytes(int w_fmt) { return w_fmt == MOESPEC_W_F32 ? 4 : (w_fmt == MOESPEC_W_BF16 ? 2 : 1); }

template <class F>
size_t fused_gu_smem(const moespec_expert_args* a, int kernel, int ring, int tile, int iters) {
  return gu_layout<F>(ring, tile, a->H, a->N, a->n * a->m, kGuRowsPerIter * iters, kernel == MOESPEC_DEDUP).total;
}
template <class F>
size_t fused_dn_smem(const moespec_expert_args* a, int kernel, int ring, int warps) {
  return dn_layout<F>(ring, warps, a->n * a->m, a->n, a->N, kernel == MOESPEC_DEDUP).total;
}

// Weight bytes each SM should keep in flight (Little's law: an H200 reads ~4.4 TB/s over 132
// SMs, 33 KB per SM per microsecond of memory latency; ~1.5x that). docs/cuda.md.
constexpr size_t kInflightTargetPerSm = 48 * 1024;

// A ring depth for one kernel: the one that keeps the most weight bytes in flight per SM
// (resident blocks x warps x (depth - 1) stages; resident blocks as shared memory, the 2048
// threads of an SM and the grid's blocks per SM allow), among the depths <= max_depth that fit
// one block; but the smallest depth that keeps two blocks resident and reaches the in-flight
// target, where one does (two blocks overlap each other's start-up).
template <class Smem>
int choose_ring(Smem smem, int max_depth, size_t per_block, size_t per_sm, int warps, size_t stage_bytes,
                size_t grid_blocks, int sms) {
  const size_t by_grid = (grid_blocks + sms - 1) / sms, by_threads = 2048 / (32 * (size_t)warps);
  int best = 2;
  size_t best_inflight = 0;
  for (int r = 2; r <= max_depth; ++r) {
    if (smem(r) > per_block) break;
    size_t blocks = per_sm / (smem(r) + kStaticSmemReserve);
    blocks = blocks < by_grid ? blocks : by_grid;
    blocks = blocks < by_threads ? blocks : by_threads;
    const size_t inflight = blocks * warps * (r - 1) * stage_bytes;
    if (blocks >= 2 && inflight >= kInflightTargetPerSm) return r;
    if (inflight > best_inflight) { best = r; best_inflight = inflight; }
  }
  return best;
}

// The fused path's ring depths and shared memory: a depth the tuning asks for is kept unless one
// block could not have that much shared memory at all; by default choose_ring picks it (gate/up
// up to 6 stages, down up to 8). False: does not fit.
template <class F>
bool plan_fused(const moespec_expert_args* a, int kernel, const Device& d, const moespec_cuda_tuning& t, Plan* pl) {
  moespec_cuda_plan& q = pl->pub;
  const size_t per_block = (size_t)d.smem_optin - kStaticSmemReserve, per_sm = (size_t)d.smem_per_sm;
  const int warps = t.dn_warps ? t.dn_warps : 4;
  auto gu = [&](int r) { return fused_gu_smem<F>(a, kernel, r, q.tile, q.iters_gu); };
  auto dn = [&](int r) { return fused_dn_smem<F>(a, kernel, r, warps); };
  const size_t gu_blocks = pl->ntiles * (size_t)((a->I + kGuRowsPerIter * q.iters_gu - 1) / (kGuRowsPerIter * q.iters_gu));
  const size_t dn_blocks = (a->H + kFusedDnRows * warps - 1) / (kFusedDnRows * warps);
  int rg = t.ring_gu ? t.ring_gu
                     : choose_ring(gu, 6, per_block, per_sm, kWarps, GuRing<F>::kStageBytes, gu_blocks, d.sms);
  int rd = t.ring_dn ? t.ring_dn
                     : choose_ring(dn, 8, per_block, per_sm, warps, DnRing<F>::kStageBytes, dn_blocks, d.sms);
  while (rg > 2 && gu(rg) > per_block) --rg;
  while (rd > 2 && dn(rd) > per_block) --rd;
  if (gu(rg) > per_block || dn(rd) > per_block) return false;
  q.ring_gu = rg;
  q.ring_dn = rd;
  q.smem_gu = (int)gu(rg);
  q.smem_dn = (int)dn(rd);
  q.threads_dn = 32 * warps;
  q.grid_dn_x = (a->H + kFusedDnRows * warps - 1) / (kFusedDnRows * warps);
  q.grid_dn_y = 1;
  q.iters_dn = 1;
  return true;
}

int make_plan(const moespec_expert_args* a, int kernel, Plan* pl) {
  int st = check_args(a, kernel);
  if (st) return st;
  Device d;
  st = query_device(&d);
  if (st) return st;
  moespec_cuda_plan& q = pl->pub;
  memset(&q, 0, sizeof q);
  st = tile_size(a, kernel, d, &q.tile);
  if (st) return st;
  const moespec_cuda_tuning t = tuning();
  const int min_blocks = t.gu_blocks_per_sm ? t.gu_blocks_per_sm : kMinBlocksPerSm;
  pl->ntiles = max_tiles(a, kernel, q.tile);
  if (a->w_fmt == MOESPEC_W_I8B32) {
    pl->vec_gu = pl->vec_dn = true;  // int8 has only the vector path (alignment checked at launch)
  } else {
    const int ch = 16 / elem_bytes(a->w_fmt);
    pl->vec_gu = a->H % ch == 0 && aligned16(a->w_gate) && aligned16(a->w_up);
    pl->vec_dn = a->I % ch == 0 && aligned16(a->w_down);
  }
  q.grid_gu_x = (int)pl->ntiles;
  q.iters_gu = row_iters(pl->ntiles, a->I, kGuRowsPerIter, d.sms, min_blocks);

  const int P = a->n * a->m;
  bool fused = t.path != MOESPEC_PATH_LEGACY && d.cc_major >= 8 && pl->vec_gu && pl->vec_dn && P >= 1 &&
               P <= kFusedMaxPairs;
  if (fused) {
    if (a->w_fmt == MOESPEC_W_I8B32 && q.iters_gu < 2) q.iters_gu = 2;  // h quantized in whole 32-row blocks
    switch (a->w_fmt) {
      case MOESPEC_W_F32: fused = plan_fused<FmtF32>(a, kernel, d, t, pl); break;
      case MOESPEC_W_BF16: fused = plan_fused<FmtBF16>(a, kernel, d, t, pl); break;
      default: fused = plan_fused<FmtI8B32>(a, kernel, d, t, pl); break;
    }
  }
  if (fused) {
    q.path = MOESPEC_PATH_FUSED;
    q.launches = 2;
    q.pdl = d.cc_major >= 9 && t.pdl != 0 ? 1 : 0;
  } else {
    q.path = MOESPEC_PATH_LEGACY;
    q.launches = 3;
    q.iters_gu = row_iters(pl->ntiles, a->I, kGuRowsPerIter, d.sms, min_blocks);
    q.iters_dn = row_iters(pl->ntiles, a->H, kDownRowsPerIter, d.sms, min_blocks);
    q.grid_dn_x = (int)pl->ntiles;
    q.grid_dn_y = (a->H + kDownRowsPerIter * q.iters_dn - 1) / (kDownRowsPerIter * q.iters_dn);
    q.threads_dn = kThreads;
    q.smem_gu = (int)(act_bytes_per_token(a->w_fmt, a->H) * q.tile + (kernel == MOESPEC_DEDUP ? 4 * (size_t)a->N : 0));
    q.smem_dn = (int)(act_bytes_per_token(a->w_fmt, a->I) * q.tile);
    q.ring_gu = q.ring_dn = 0;
    q.pdl = 0;
  }
  q.grid_gu_y = (a->I + kGuRowsPerIter * q.iters_gu - 1) / (kGuRowsPerIter * q.iters_gu);
  return MOESPEC_OK;
}

// ---- launches ------------------------------------------------------------------------------
// Above 48 KiB of dynamic shared memory a kernel must opt in, once per device: remembered per
// (kernel, device), so that repeated calls (and CUDA graph capture) make no attribute calls.
template <class Kern>
cudaError_t allow_smem(Kern kern, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> raised;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = raised[{reinterpret_cast<const void*>(kern), dev}];
  if (have >= smem) return cudaSuccess;
  err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess) have = smem;
  return err;
}

template <class Kern>
cudaError_t launch(Kern kern, dim3 grid, int threads, size_t smem, cudaStream_t stream, const Params& p) {
  cudaError_t err = allow_smem(kern, smem);
  if (err != cudaSuccess) return err;
  kern<<<grid, threads, smem, stream>>>(p);
  return cudaGetLastError();
}

// A launch that may begin before the previous kernel on the stream has finished (programmatic
// dependent launch, sm_90+): the kernel must call pdl_wait() before reading that kernel's output.
template <class Kern>
cudaError_t launch_dependent(Kern kern, dim3 grid, int threads, size_t smem, cudaStream_t stream, const Params& p) {
  cudaError_t err = allow_smem(kern, smem);
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kern, p);
}

template <class F, int TMAX, bool DEDUP, bool VEC_GU, bool VEC_DN>
int run_legacy(const Params& p, const moespec_cuda_plan& q, cudaStream_t stream) {
  const dim3 grid_gu(q.grid_gu_x, q.grid_gu_y), grid_dn(q.grid_dn_x, q.grid_dn_y);
  cudaError_t err = launch(gate_up_kernel<F, TMAX, VEC_GU, DEDUP>, grid_gu, kThreads, q.smem_gu, stream, p);
  if (err == cudaSuccess) err = launch(down_kernel<F, TMAX, VEC_DN, DEDUP>, grid_dn, kThreads, q.smem_dn, stream, p);
  if (err == cudaSuccess) {
    size_t blocks = ((size_t)p.n * p.H + 255) / 256;
    if (blocks > 4096) blocks = 4096;  // grid-stride loop covers the rest
    combine_kernel<<<(unsigned)blocks, 256, 0, stream>>>(p);
    err = cudaGetLastError();
  }
  return (int)err;
}

template <class F, int TMAX, bool DEDUP>
int run_fused(const Params& p, const moespec_cuda_plan& q, cudaStream_t stream) {
  const dim3 grid_gu(q.grid_gu_x, q.grid_gu_y), grid_dn(q.grid_dn_x);
  cudaError_t err = launch(gate_up_ring_kernel<F, TMAX, DEDUP>, grid_gu, kThreads, q.smem_gu, stream, p);
  if (err == cudaSuccess) {
    err = q.pdl ? launch_dependent(down_combine_kernel<F, TMAX, DEDUP>, grid_dn, q.threads_dn, q.smem_dn, stream, p)
                : launch(down_combine_kernel<F, TMAX, DEDUP>, grid_dn, q.threads_dn, q.smem_dn, stream, p);
  }
  return (int)err;
}

template <class F, int TMAX, bool DEDUP>
int run_path(const Params& p, const Plan& pl, cudaStream_t stream) {
  if (pl.pub.path == MOESPEC_PATH_FUSED) return run_fused<F, TMAX, DEDUP>(p, pl.pub, stream);
  if constexpr (F::kInt8) {
    return run_legacy<F, TMAX, DEDUP, true, true>(p, pl.pub, stream);
  } else {
    if (pl.vec_gu && pl.vec_dn) return run_legacy<F, TMAX, DEDUP, true, true>(p, pl.pub, stream);
    if (pl.vec_gu) return run_legacy<F, TMAX, DEDUP, true, false>(p, pl.pub, stream);
    if (pl.vec_dn) return run_legacy<F, TMAX, DEDUP, false, true>(p, pl.pub, stream);
    return run_legacy<F, TMAX, DEDUP, false, false>(p, pl.pub, stream);
  }
}

template <class F>
int run_fmt(int kernel, const Params& p, const Plan& pl, cudaStream_t stream) {
  return kernel == MOESPEC_DEDUP ? run_path<F, MOESPEC_TILE_MAX, true>(p, pl, stream)
                                 : run_path<F, 1, false>(p, pl, stream);
}

}  // namespace moespec_cuda

using namespace moespec_cuda;

extern "C" int moespec_cuda_workspace_bytes(const moespec_expert_args* a, int kernel, size_t* bytes) {
  int tile = 0;
  int st = check_args(a, kernel);
  Device d;
  if (!st) st = query_device(&d);
  if (!st) st = tile_size(a, kernel, d, &tile);
  if (st) return st;
  if (!bytes) return MOESPEC_ERR_NULL;
  *bytes = layout(a, kernel, tile).total;
  return MOESPEC_OK;
}

extern "C" int moespec_cuda_dedup_tile(const moespec_expert_args* a, int* tile) {
  if (!tile) return MOESPEC_ERR_NULL;
  int st = check_args(a, MOESPEC_DEDUP);
  Device d;
  if (!st) st = query_device(&d);
  if (!st) st = tile_size(a, MOESPEC_DEDUP, d, tile);
  return st;
}

extern "C" int moespec_cuda_get_plan(const moespec_expert_args* a, int kernel, moespec_cuda_plan* plan) {
  if (!plan) return MOESPEC_ERR_NULL;
  Plan pl;
  const int st = make_plan(a, kernel, &pl);
  if (!st) *plan = pl.pub;
  return st;
}

extern "C" int moespec_cuda_set_tuning(const moespec_cuda_tuning* t) {
  if (!t) return MOESPEC_ERR_NULL;
  if (!tuning_valid(*t)) return MOESPEC_ERR_TUNING;
  tuning() = *t;
  return MOESPEC_OK;
}

extern "C" void moespec_cuda_get_tuning(moespec_cuda_tuning* t) {
  if (t) *t = tuning();
}

extern "C" int moespec_cuda_expert_forward(const moespec_expert_args* a, int kernel,
                                           cudaStream_t stream) {
  int st = check_args(a, kernel);
  if (st) return st;
  if (a->n == 0) return MOESPEC_OK;  // empty pass: nothing to write
  if (!a->x || !a->ids || !a->w_gate || !a->w_up || !a->w_down || !a->y || !a->workspace)
    return MOESPEC_ERR_NULL;
  if (a->w_fmt == MOESPEC_W_I8B32 && (!a->s_gate || !a->s_up || !a->s_down)) return MOESPEC_ERR_NULL;
  if (a->w_fmt == MOESPEC_W_I8B32 && (!aligned16(a->w_gate) || !aligned16(a->w_up) || !aligned16(a->w_down)))
    return MOESPEC_ERR_ALIGN;  // int8 has only the vector path: every row 32-byte aligned
  Plan pl;
  st = make_plan(a, kernel, &pl);
  if (st) return st;
  const moespec_cuda_plan& q = pl.pub;
  const Workspace ws = layout(a, kernel, q.tile);
  if (a->workspace_bytes < ws.total) return MOESPEC_ERR_WORKSPACE;

  Params p;
  p.n = a->n; p.m = a->m; p.N = a->N; p.H = a->H; p.I = a->I; p.P = a->n * a->m; p.tile = q.tile;
  p.iters_gu = q.iters_gu;
  p.iters_dn = q.iters_dn;
  p.ring_gu = q.ring_gu;
  p.ring_dn = q.ring_dn;
  p.x = a->x;
  p.ids = a->ids;
  p.gates = a->gates;
  p.wg = a->w_gate; p.wu = a->w_up; p.wd = a->w_down;
  p.sg = a->s_gate; p.su = a->s_up; p.sd = a->s_down;
  p.y = a->y;
  char* base = static_cast<char*>(a->workspace);
  p.h = reinterpret_cast<float*>(base + ws.h);
  p.hs = base + ws.h;
  p.o = reinterpret_cast<float*>(base + ws.o);
  p.tiles = reinterpret_cast<int*>(base + ws.tiles);
  p.flags = reinterpret_cast<int*>(base + ws.flags);

  switch (a->w_fmt) {
    case MOESPEC_W_F32: return run_fmt<FmtF32>(kernel, p, pl, stream);
    case MOESPEC_W_BF16: return run_fmt<FmtBF16>(kernel, p, pl, stream);
    default: return run_fmt<FmtI8B32>(kernel, p, pl, stream);
  }
}

extern "C" const char* moespec_cuda_status_string(int status) {
  switch (status) {
    case MOESPEC_OK: return "success";
    case MOESPEC_ERR_SHAPE: return "moespec_cuda: n, m, N, H or I out of range (need n >= 0, m, N, H, I >= 1)";
    case MOESPEC_ERR_FORMAT: return "moespec_cuda: unknown kernel or weight format";
    case MOESPEC_ERR_NULL: return "moespec_cuda: a required pointer is NULL (int8-block needs all scales)";
    case MOESPEC_ERR_INT8_SHAPE: return "moespec_cuda: int8-block format needs H and I multiples of 32";
    case MOESPEC_ERR_WORKSPACE: return "moespec_cuda: workspace smaller than moespec_cuda_workspace_bytes()";
    case MOESPEC_ERR_SMEM: return "moespec_cuda: H or I too large: one token's activations do not fit in shared memory";
    case MOESPEC_ERR_GRID: return "moespec_cuda: H or I too large for the launch grid";
    case MOESPEC_ERR_ALIGN: return "moespec_cuda: int8-block weights must be 16-byte aligned (fresh contiguous tensors are)";
    case MOESPEC_ERR_TUNING:
      return "moespec_cuda: tuning out of range (path 0..2, pdl -1..1, ring_gu/ring_dn 0 or 2..8, dn_warps 0 or 1..8, "
             "gu_blocks_per_sm 0 or 1..64)";
    default: return status > 0 ? cudaGetErrorString((cudaError_t)status) : "moespec_cuda: unknown status";
  }
}
