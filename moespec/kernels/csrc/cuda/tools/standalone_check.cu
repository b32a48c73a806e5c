// standalone_check.cu: a torch-free check of the CUDA expert kernels against a host reference.
//
// Build (the nvcc test links it; scripts/gpu_check.sh runs it on a GPU):
//   nvcc -std=c++17 -O2 -arch=sm_90 -I.. standalone_check.cu ../expert_kernels.cu -o standalone_check
// The host reference follows docs/kernels.md's numerics (bf16-rounded / int8-block-quantized
// activations, exact dequantized weights) in double precision; the kernels must agree with it to
// float32 accumulation error, and the per-slot and dedup kernels must agree bitwise.
// Every case runs both kernels on every execution path (legacy three launches; fused with and
// without programmatic dependent launch): each output against the reference, and all six bitwise
// equal. Cases with a NaN or infinity in x or in the gates check that exactly the affected
// tokens' rows are NaN.
// Exit status 0 when every case passes, 1 otherwise, 2 when no GPU is usable.
// `--small` runs only the cases with at most 4M weights per matrix stack (the CPU emulation in
// tests/cuda_emu uses it).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "moespec_cuda.h"
#include "check_cuda.h"
#include "expert_common.cuh"

using moespec_cuda::act_inv;
using moespec_cuda::act_quant;
using moespec_cuda::act_scale;
using moespec_cuda::bf16_bits_to_float;
using moespec_cuda::float_to_bf16_bits;
using moespec_cuda::round_bf16;


struct Case {
  const char* name;
  int n, m, N, H, I, fmt;
  int routing;  // 0 random distinct, 1 every token the same experts, 2 all pairs distinct, 3 one invalid id
  bool gates;
  int bad = 0;  // non-finite input in token 1: 1 NaN in x, 2 +inf in x, 3 -inf gate, 4 NaN gate
};

// The execution paths every case runs on (moespec_cuda_tuning).
struct PathConfig {
  const char* name;
  int path, pdl;
};
static const PathConfig kPaths[] = {
    {"legacy", MOESPEC_PATH_LEGACY, 0}, {"fused", MOESPEC_PATH_FUSED, -1}, {"fused-nopdl", MOESPEC_PATH_FUSED, 0}};

// Activations of one row in the format's precision (as the kernels stage them).
static std::vector<double> act_row(const float* v, int K, int fmt) {
  std::vector<double> out(K);
  if (fmt == MOESPEC_W_F32) {
    for (int k = 0; k < K; ++k) out[k] = v[k];
  } else if (fmt == MOESPEC_W_BF16) {
    for (int k = 0; k < K; ++k) out[k] = round_bf16(v[k]);
  } else {
    for (int b = 0; b < K / 32; ++b) {
      float amax = 0.f;
      for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(v[b * 32 + i]));
      const float sa = act_scale(amax), inv = act_inv(sa);
      for (int i = 0; i < 32; ++i) out[b * 32 + i] = (double)act_quant(v[b * 32 + i], inv) * sa;
    }
  }
  return out;
}

struct Weights {
  std::vector<float> f;     // exact values (dequantized), [N][rows][K]
  std::vector<uint8_t> raw; // storage bytes
  std::vector<float> s;     // int8 scales
};

static Weights make_weights(int N, int rows, int K, int fmt, std::mt19937& rng) {
  Weights w;
  const size_t cnt = (size_t)N * rows * K;
  w.f.resize(cnt);
  std::normal_distribution<float> nd(0.f, 1.f / std::sqrt((float)K));
  if (fmt == MOESPEC_W_F32) {
    w.raw.resize(cnt * 4);
    for (size_t i = 0; i < cnt; ++i) w.f[i] = nd(rng);
    std::memcpy(w.raw.data(), w.f.data(), cnt * 4);
  } else if (fmt == MOESPEC_W_BF16) {
    w.raw.resize(cnt * 2);
    uint16_t* b = reinterpret_cast<uint16_t*>(w.raw.data());
    for (size_t i = 0; i < cnt; ++i) {
      b[i] = float_to_bf16_bits(nd(rng));
      w.f[i] = bf16_bits_to_float(b[i]);
    }
  } else {
    w.raw.resize(cnt);
    w.s.resize(cnt / 32);
    std::uniform_int_distribution<int> qd(-127, 127);
    std::uniform_real_distribution<float> sd(0.5f, 1.5f);
    for (size_t b = 0; b < cnt / 32; ++b) w.s[b] = sd(rng) * 1.7320508f / (127.f * std::sqrt((float)K));
    for (size_t i = 0; i < cnt; ++i) {
      const int q = qd(rng);
      w.raw[i] = (uint8_t)(int8_t)q;
      w.f[i] = (float)q * w.s[i / 32];
    }
  }
  return w;
}

template <class T>
static T* to_device(const std::vector<T>& v) {
  T* d = nullptr;
  CK(cudaMalloc(&d, v.size() * sizeof(T) + 16));
  CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

static bool run_case(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  const int P = c.n * c.m;
  Weights wg = make_weights(c.N, c.I, c.H, c.fmt, rng), wu = make_weights(c.N, c.I, c.H, c.fmt, rng);
  Weights wd = make_weights(c.N, c.H, c.I, c.fmt, rng);
  std::vector<float> x((size_t)c.n * c.H), gates(P);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : x) v = nd(rng);
  std::uniform_real_distribution<float> gd(0.1f, 1.f);
  for (auto& g : gates) g = gd(rng);
  std::vector<int64_t> ids(P);
  std::vector<int> perm(c.N);
  for (int t = 0; t < c.n; ++t) {
    for (int e = 0; e < c.N; ++e) perm[e] = e;
    if (c.routing != 1 || t == 0) std::shuffle(perm.begin(), perm.end(), rng);
    for (int s = 0; s < c.m; ++s) {
      if (c.routing == 1) ids[t * c.m + s] = t == 0 ? perm[s] : ids[s];  // token 0's experts
      else if (c.routing == 2) ids[t * c.m + s] = (t * c.m + s) % c.N;
      else ids[t * c.m + s] = perm[s];
    }
  }
  if (c.routing == 3) ids[P - 1] = c.N + 5;  // out of range: that token's row must be NaN
  const float inf = INFINITY;
  if (c.bad == 1) x[(size_t)1 * c.H + c.H / 2] = NAN;
  if (c.bad == 2) x[(size_t)1 * c.H + 3] = inf;
  if (c.bad == 3) gates[1 * c.m + c.m - 1] = -inf;
  if (c.bad == 4) gates[1 * c.m] = NAN;

  // Host reference (double accumulation, format numerics).
  std::vector<double> ref((size_t)c.n * c.H, 0.0);
  std::vector<bool> bad(c.n, false);
  for (int t = 0; t < c.n; ++t) {
    const std::vector<double> xa = act_row(&x[(size_t)t * c.H], c.H, c.fmt);
    for (int s = 0; s < c.m; ++s) {
      const int64_t e = ids[t * c.m + s];
      if (e < 0 || e >= c.N || (c.bad && t == 1)) { bad[t] = true; continue; }
      std::vector<float> h(c.I);
      for (int i = 0; i < c.I; ++i) {
        const float* g = &wg.f[((size_t)e * c.I + i) * c.H];
        const float* u = &wu.f[((size_t)e * c.I + i) * c.H];
        double gs = 0, us = 0;
        for (int k = 0; k < c.H; ++k) { gs += g[k] * xa[k]; us += u[k] * xa[k]; }
        h[i] = (float)(gs / (1.0 + std::exp(-gs)) * us);
      }
      const std::vector<double> ha = act_row(h.data(), c.I, c.fmt);
      const double gt = c.gates ? gates[t * c.m + s] : 1.0;
      for (int j = 0; j < c.H; ++j) {
        const float* d = &wd.f[((size_t)e * c.H + j) * c.I];
        double o = 0;
        for (int i = 0; i < c.I; ++i) o += d[i] * ha[i];
        ref[(size_t)t * c.H + j] += gt * o;
      }
    }
  }

  float* dx = to_device(x);
  int64_t* dids = to_device(ids);
  float* dgates = c.gates ? to_device(gates) : nullptr;
  uint8_t *dwg = to_device(wg.raw), *dwu = to_device(wu.raw), *dwd = to_device(wd.raw);
  float *dsg = nullptr, *dsu = nullptr, *dsd = nullptr;
  if (c.fmt == MOESPEC_W_I8B32) { dsg = to_device(wg.s); dsu = to_device(wu.s); dsd = to_device(wd.s); }
  float* dy = nullptr;
  CK(cudaMalloc(&dy, sizeof(float) * c.n * c.H));

  const int nk = 2 * (int)(sizeof(kPaths) / sizeof(kPaths[0]));
  std::vector<std::vector<float>> y(nk);
  bool ok = true;
  char label[64];
  for (int r = 0; r < nk; ++r) {
    const PathConfig& pc = kPaths[r / 2];
    const int kernel = r % 2;
    moespec_cuda_tuning tn{};
    tn.path = pc.path;
    tn.pdl = pc.pdl;
    if (moespec_cuda_set_tuning(&tn) != MOESPEC_OK) { std::printf("FAIL cannot set tuning\n"); return false; }
    moespec_expert_args a{};
    a.n = c.n; a.m = c.m; a.N = c.N; a.H = c.H; a.I = c.I;
    a.x = dx; a.ids = dids; a.gates = dgates; a.w_fmt = c.fmt;
    a.w_gate = dwg; a.w_up = dwu; a.w_down = dwd; a.s_gate = dsg; a.s_up = dsu; a.s_down = dsd;
    a.y = dy;
    moespec_cuda_plan plan{};
    int st = moespec_cuda_get_plan(&a, kernel, &plan);
    std::snprintf(label, sizeof label, "%s %s%s", kernel ? "dedup" : "slot",
                  plan.path == MOESPEC_PATH_FUSED ? (plan.pdl ? "fused+pdl" : "fused") : "legacy",
                  plan.path == MOESPEC_PATH_FUSED || pc.path != MOESPEC_PATH_FUSED ? "" : "(fallback)");
    size_t bytes = 0;
    if (st == 0) st = moespec_cuda_workspace_bytes(&a, kernel, &bytes);
    void* ws = nullptr;
    if (st == 0) {
      CK(cudaMalloc(&ws, bytes));
      CK(cudaMemset(ws, 0xCD, bytes));  // no zeros to rely on
      CK(cudaMemset(dy, 0xCD, sizeof(float) * c.n * c.H));
      a.workspace = ws;
      a.workspace_bytes = bytes;
    }
    if (st == 0) st = moespec_cuda_expert_forward(&a, kernel, 0);
    if (st == 0) st = (int)cudaDeviceSynchronize();
    if (st != 0) {
      std::printf("FAIL %-30s %-22s %s\n", c.name, label, moespec_cuda_status_string(st));
      ok = false;
      continue;
    }
    y[r].resize((size_t)c.n * c.H);
    CK(cudaMemcpy(y[r].data(), dy, sizeof(float) * y[r].size(), cudaMemcpyDeviceToHost));
    CK(cudaFree(ws));
    double maxref = 0, maxerr = 0;
    bool nan_ok = true;
    for (int t = 0; t < c.n; ++t)
      for (int j = 0; j < c.H; ++j) {
        const double v = y[r][(size_t)t * c.H + j], rv = ref[(size_t)t * c.H + j];
        if (bad[t]) { nan_ok &= std::isnan(v); continue; }
        maxref = std::fmax(maxref, std::fabs(rv));
        maxerr = std::isfinite(v) ? std::fmax(maxerr, std::fabs(v - rv)) : INFINITY;
      }
    // float32 accumulation over H + I terms; bf16/int8 add rare one-step rounding flips of h
    const double tol = c.fmt == MOESPEC_W_F32 ? 2e-5 : 2e-3;
    const double rel = maxref > 0 ? maxerr / maxref : maxerr;
    const bool pass = rel <= tol && nan_ok;
    ok &= pass;
    std::printf("%s %-30s %-22s max|err|/max|ref| = %.2e (tol %.0e)%s\n", pass ? "ok  " : "FAIL", c.name, label, rel,
                tol, nan_ok ? "" : "  [a NaN row is not all NaN]");
  }
  bool same = true, all = true;
  for (int r = 1; r < nk; ++r) {
    if (y[r].empty() || y[0].empty()) { all = false; continue; }
    // bytewise, so the NaN rows (one canonical NaN) compare equal too
    same &= std::memcmp(y[0].data(), y[r].data(), sizeof(float) * y[0].size()) == 0;
  }
  if (all) {
    std::printf("%s %-30s slot and dedup outputs %s on every path\n", same ? "ok  " : "FAIL", c.name,
                same ? "bitwise equal" : "differ");
    ok &= same;
  }
  cudaFree(dx); cudaFree(dids); cudaFree(dgates); cudaFree(dwg); cudaFree(dwu); cudaFree(dwd);
  cudaFree(dsg); cudaFree(dsu); cudaFree(dsd); cudaFree(dy);
  return ok;
}

int main(int argc, char** argv) {
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: nothing checked\n");
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  const Case cases[] = {
      {"f32 small n=1", 1, 2, 8, 256, 128, MOESPEC_W_F32, 0, false},
      {"f32 small n=5 gates", 5, 2, 8, 256, 128, MOESPEC_W_F32, 0, true},
      {"f32 odd shape (scalar path)", 3, 2, 5, 100, 52, MOESPEC_W_F32, 0, true},
      {"bf16 odd shape (scalar path)", 3, 3, 6, 100, 44, MOESPEC_W_BF16, 0, true},
      {"bf16 same experts n=9", 9, 4, 16, 512, 256, MOESPEC_W_BF16, 1, true},
      {"int8 same experts n=20", 20, 4, 16, 512, 256, MOESPEC_W_I8B32, 1, true},
      {"int8 all distinct m=1", 7, 1, 8, 256, 128, MOESPEC_W_I8B32, 2, false},
      {"f32 N=m+1", 6, 3, 4, 256, 96, MOESPEC_W_F32, 0, true},
      {"bf16 invalid id -> NaN", 4, 2, 8, 256, 128, MOESPEC_W_BF16, 3, true},
      {"bf16 ragged chunks", 5, 3, 7, 320, 96, MOESPEC_W_BF16, 0, true},
      {"int8 ragged blocks", 5, 3, 7, 352, 160, MOESPEC_W_I8B32, 0, true},
      {"f32 ragged chunks m=5", 3, 5, 9, 296, 36, MOESPEC_W_F32, 0, false},
      {"f32 wide H, 72 KB smem opt-in", 9, 2, 3, 2048, 64, MOESPEC_W_F32, 1, true},
      {"f32 olmoe shape n=9", 9, 8, 64, 2048, 1024, MOESPEC_W_F32, 0, true},
      {"bf16 olmoe shape n=4", 4, 8, 64, 2048, 1024, MOESPEC_W_BF16, 0, true},
      {"int8 olmoe shape n=9", 9, 8, 64, 2048, 1024, MOESPEC_W_I8B32, 0, true},
      {"int8 gpt-oss shape n=2", 2, 4, 32, 2880, 2880, MOESPEC_W_I8B32, 0, true},
      {"f32 NaN in x", 3, 2, 8, 256, 128, MOESPEC_W_F32, 0, true, 1},
      {"bf16 +inf in x", 3, 2, 8, 256, 128, MOESPEC_W_BF16, 0, true, 2},
      {"int8 NaN in x", 3, 2, 8, 256, 128, MOESPEC_W_I8B32, 0, true, 1},
      {"int8 +inf in x", 4, 2, 8, 256, 128, MOESPEC_W_I8B32, 1, true, 2},
      {"f32 -inf gate", 3, 3, 8, 256, 128, MOESPEC_W_F32, 0, true, 3},
      {"int8 NaN gate", 3, 2, 8, 256, 128, MOESPEC_W_I8B32, 0, true, 4},
  };
  bool ok = true;
  unsigned seed = 0;
  for (const Case& c : cases) {
    ++seed;
    if (!small || (double)c.N * c.H * c.I <= 4e6) ok &= run_case(c, seed);
  }
  std::printf(ok ? "ALL PASSED\n" : "SOME CASES FAILED\n");
  return ok ? 0 : 1;
}
