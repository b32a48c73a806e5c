// bench_standalone.cu: torch-free bandwidth benchmark of the per-slot and dedup CUDA kernels.
//
// For a GPU machine without a CUDA build of torch (scripts/gpu_check.sh runs it either way):
//   nvcc -std=c++17 -O3 -arch=sm_90 -I.. bench_standalone.cu ../expert_kernels.cu -o bench_standalone
//   ./bench_standalone OUT.csv [--reps R] [--warmup W] [--formats f32,bf16,int8_b32] [--ns 1,2,...]
//                      name:N,H,I,m [name:N,H,I,m ...]        (shapes: moespec.models.PRESETS)
// Per shape, format and pass size n, one interleaved run times the per-slot kernel, the dedup
// kernel and a read of 1 GiB (the GPU's read bandwidth in the same run), each call after a
// 256 MiB L2 flush and a ~1 ms spin kernel that holds the GPU while the host enqueues the call
// (so the CUDA events bracket GPU work only). Ids: each token's m experts uniform without
// replacement (seeded). Writes one CSV row per (shape, format, n) with medians and quartiles of
// time, beta_slot = n m b / t, beta_dedup = U b / t, the read bandwidth and r = beta_dedup /
// beta_slot (paper 1, Section 2), and prints a markdown table.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "moespec_cuda.h"
#include "check_cuda.h"


namespace {

__device__ inline uint32_t hash32(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return (uint32_t)((x ^ (x >> 31)) >> 32);
}
__device__ inline float uniform_pm1(uint64_t i, uint32_t seed) {  // in [-1, 1)
  return (float)(hash32(i * 0x100000001b3ull + seed) >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

// Random values: float / bf16 uniform in [-a, a); int8 uniform in [-127, 127]; scales in [0.5, 1.5) * a.
__global__ void fill_f32(float* p, size_t n, uint32_t seed, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = a * uniform_pm1(i, seed);
}
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (uint16_t)(__float_as_uint(a * uniform_pm1(i, seed)) >> 16);
}
__global__ void fill_i8(int8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = (int8_t)((int)(hash32(i * 0x100000001b3ull + seed) % 255u) - 127);
}
__global__ void fill_scale(float* p, size_t n, uint32_t seed, float a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    p[i] = a * (1.0f + 0.5f * uniform_pm1(i, seed));
}
// L2 flush: read and write every 16 bytes of the buffer.
__global__ void flush_kernel(int4* p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    int4 v = p[i];
    v.x += 1;
    p[i] = v;
  }
}
// Read bandwidth: sum a buffer with 16-byte loads (the sum is stored so the reads stay).
__global__ void read_kernel(const float4* p, size_t n, float* out) {
  float s = 0.f;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float4 v = __ldg(p + i);
    s += v.x + v.y + v.z + v.w;
  }
  if (s == 12345.678f) *out = s;  // practically never true; keeps the loads
}
__global__ void spin_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

template <class K, class... A>
void grid_launch(K kern, A... args) {
  kern<<<4096, 256>>>(args...);
  CK(cudaGetLastError());
}

struct Shape {
  std::string name;
  int N, H, I, m;
};

struct Stats {
  double med, q25, q75;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  auto q = [&](double f) {  // linear interpolation, as numpy's default
    const double pos = f * (v.size() - 1);
    const size_t lo = (size_t)pos;
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (pos - lo) * (v[hi] - v[lo]);
  };
  return {q(0.5), q(0.25), q(0.75)};
}

double expert_bytes(int fmt, int H, int I) {
  const double w = 3.0 * H * I;
  return fmt == MOESPEC_W_F32 ? 4 * w : (fmt == MOESPEC_W_BF16 ? 2 * w : w * 36.0 / 32.0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT.csv [--reps R] [--warmup W] [--formats f32,bf16,int8_b32] [--ns 1,2,..] "
                         "name:N,H,I,m ...\n", argv[0]);
    return 2;
  }
  const char* out_path = argv[1];
  int reps = 30, warmup = 3;
  std::vector<int> fmts = {MOESPEC_W_F32, MOESPEC_W_BF16, MOESPEC_W_I8B32}, ns = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<Shape> shapes;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--reps" || a == "--warmup" || a == "--formats" || a == "--ns") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--reps") reps = std::atoi(v.c_str());
      if (a == "--warmup") warmup = std::atoi(v.c_str());
      if (a == "--formats") {
        fmts.clear();
        if (v.find("f32") != std::string::npos) fmts.push_back(MOESPEC_W_F32);
        if (v.find("bf16") != std::string::npos) fmts.push_back(MOESPEC_W_BF16);
        if (v.find("int8") != std::string::npos) fmts.push_back(MOESPEC_W_I8B32);
      }
      if (a == "--ns") {
        ns.clear();
        for (size_t p = 0; p < v.size();) {
          ns.push_back(std::atoi(v.c_str() + p));
          const size_t c = v.find(',', p);
          p = c == std::string::npos ? v.size() : c + 1;
        }
      }
      continue;
    }
    Shape s;
    const size_t colon = a.find(':');
    if (colon == std::string::npos ||
        std::sscanf(a.c_str() + colon + 1, "%d,%d,%d,%d", &s.N, &s.H, &s.I, &s.m) != 4 || s.m < 1 || s.m > s.N) {
      std::fprintf(stderr, "bad shape %s: expected name:N,H,I,m with 1 <= m <= N\n", a.c_str());
      return 2;
    }
    s.name = a.substr(0, colon);
    shapes.push_back(s);
  }
  if (shapes.empty() || reps < 1 || fmts.empty()) {
    std::fprintf(stderr, "nothing to measure (shapes, --reps >= 1, --formats)\n");
    return 2;
  }
  FILE* csv = std::fopen(out_path, "w");
  if (!csv) {
    std::fprintf(stderr, "cannot write %s\n", out_path);
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  std::fprintf(csv, "model,fmt,n,m,N,H,I,U,expert_bytes,t_slot_s,t_slot_q25_s,t_slot_q75_s,t_dedup_s,t_dedup_q25_s,"
                    "t_dedup_q75_s,t_read_s,read_bytes,beta_slot_GBps,beta_dedup_GBps,beta_read_GBps,r,reps,gpu\n");

  const size_t flush_bytes = 256u << 20, read_bytes = 1u << 30;
  int4* flush_buf = nullptr;
  float4* read_buf = nullptr;
  float* sink = nullptr;
  CK(cudaMalloc(&flush_buf, flush_bytes));
  CK(cudaMalloc(&read_buf, read_bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(flush_buf, 0, flush_bytes));
  grid_launch(fill_f32, reinterpret_cast<float*>(read_buf), read_bytes / 4, 7u, 1.0f);
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  const long long spin_cycles = 2000000;  // ~1 ms at 2 GHz: longer than the host needs to enqueue a call
  const char* fmt_names[] = {"f32", "bf16", "int8_b32"};

  std::printf("\n| model | fmt | n | U | t slot (us) | t dedup (us) | beta slot | beta dedup | read | r(n) |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    for (int fmt : fmts) {
      const size_t gu = (size_t)s.N * s.I * s.H, dn = (size_t)s.N * s.H * s.I;
      const size_t esz = fmt == MOESPEC_W_F32 ? 4 : (fmt == MOESPEC_W_BF16 ? 2 : 1);
      void *wg, *wu, *wd;
      float *sg = nullptr, *su = nullptr, *sd = nullptr;
      CK(cudaMalloc(&wg, gu * esz));
      CK(cudaMalloc(&wu, gu * esz));
      CK(cudaMalloc(&wd, dn * esz));
      void* ws[3] = {wg, wu, wd};
      const size_t cnt[3] = {gu, gu, dn};
      const int K[3] = {s.H, s.H, s.I};
      for (int j = 0; j < 3; ++j) {
        const float a = std::sqrt(3.0f / K[j]);
        if (fmt == MOESPEC_W_F32) grid_launch(fill_f32, (float*)ws[j], cnt[j], 11u + j, a);
        else if (fmt == MOESPEC_W_BF16) grid_launch(fill_bf16, (uint16_t*)ws[j], cnt[j], 11u + j, a);
        else grid_launch(fill_i8, (int8_t*)ws[j], cnt[j], 11u + j);
      }
      if (fmt == MOESPEC_W_I8B32) {
        float** sp[3] = {&sg, &su, &sd};
        for (int j = 0; j < 3; ++j) {
          CK(cudaMalloc(sp[j], cnt[j] / 32 * 4));
          grid_launch(fill_scale, *sp[j], cnt[j] / 32, 21u + j, std::sqrt(3.0f / K[j]) / 127.0f);
        }
      }
      const double b = expert_bytes(fmt, s.H, s.I);
      for (int n : ns) {
        std::mt19937 rng(1000u * (unsigned)n + (unsigned)s.N);
        std::vector<int64_t> ids((size_t)n * s.m);
        std::vector<int> perm(s.N);
        for (int t = 0; t < n; ++t) {
          for (int e = 0; e < s.N; ++e) perm[e] = e;
          std::shuffle(perm.begin(), perm.end(), rng);
          for (int k = 0; k < s.m; ++k) ids[(size_t)t * s.m + k] = perm[k];
        }
        std::vector<int64_t> uniq(ids);
        std::sort(uniq.begin(), uniq.end());
        const int U = (int)(std::unique(uniq.begin(), uniq.end()) - uniq.begin());
        float *x, *gates, *y;
        int64_t* dids;
        CK(cudaMalloc(&x, sizeof(float) * n * s.H));
        CK(cudaMalloc(&gates, sizeof(float) * n * s.m));
        CK(cudaMalloc(&y, sizeof(float) * n * s.H));
        CK(cudaMalloc(&dids, sizeof(int64_t) * ids.size()));
        CK(cudaMemcpy(dids, ids.data(), sizeof(int64_t) * ids.size(), cudaMemcpyHostToDevice));
        grid_launch(fill_f32, x, (size_t)n * s.H, 31u + n, 1.0f);
        grid_launch(fill_scale, gates, (size_t)n * s.m, 41u + n, 0.5f);
        moespec_expert_args a{};
        a.n = n; a.m = s.m; a.N = s.N; a.H = s.H; a.I = s.I;
        a.x = x; a.ids = dids; a.gates = gates; a.w_fmt = fmt;
        a.w_gate = wg; a.w_up = wu; a.w_down = wd; a.s_gate = sg; a.s_up = su; a.s_down = sd; a.y = y;
        size_t bytes[2] = {0, 0};
        for (int k = 0; k < 2; ++k) {
          const int st = moespec_cuda_workspace_bytes(&a, k, &bytes[k]);
          if (st) { std::fprintf(stderr, "%s\n", moespec_cuda_status_string(st)); return 1; }
        }
        void* work = nullptr;
        CK(cudaMalloc(&work, std::max(bytes[0], bytes[1])));
        a.workspace = work;
        a.workspace_bytes = std::max(bytes[0], bytes[1]);
        std::vector<double> t[3];
        for (int r = -warmup; r < reps; ++r) {
          for (int c = 0; c < 3; ++c) {  // interleaved: slot, dedup, read
            grid_launch(flush_kernel, flush_buf, flush_bytes / 16);
            CK(cudaDeviceSynchronize());
            spin_kernel<<<1, 1>>>(spin_cycles);
            CK(cudaEventRecord(ev0));
            if (c < 2) {
              const int st = moespec_cuda_expert_forward(&a, c, 0);
              if (st) { std::fprintf(stderr, "%s\n", moespec_cuda_status_string(st)); return 1; }
            } else {
              grid_launch(read_kernel, (const float4*)read_buf, read_bytes / 16, sink);
            }
            CK(cudaEventRecord(ev1));
            CK(cudaEventSynchronize(ev1));
            float ms = 0.f;
            CK(cudaEventElapsedTime(&ms, ev0, ev1));
            if (r >= 0) t[c].push_back(ms * 1e-3);
          }
        }
        const Stats ts = stats(t[0]), td = stats(t[1]), tr = stats(t[2]);
        const double bs = n * s.m * b / ts.med, bd = U * b / td.med, br = read_bytes / tr.med;
        std::fprintf(csv, "%s,%s,%d,%d,%d,%d,%d,%d,%.0f,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%.9g,%zu,%.2f,%.2f,%.2f,%.5f,%d,%s\n",
                     s.name.c_str(), fmt_names[fmt], n, s.m, s.N, s.H, s.I, U, b, ts.med, ts.q25, ts.q75, td.med,
                     td.q25, td.q75, tr.med, read_bytes, bs / 1e9, bd / 1e9, br / 1e9, bd / bs, reps, prop.name);
        std::fflush(csv);
        std::printf("| %s | %s | %d | %d | %.1f | %.1f | %.0f | %.0f | %.0f | %.3f |\n", s.name.c_str(),
                    fmt_names[fmt], n, U, ts.med * 1e6, td.med * 1e6, bs / 1e9, bd / 1e9, br / 1e9, bd / bs);
        std::fflush(stdout);
        CK(cudaFree(x)); CK(cudaFree(gates)); CK(cudaFree(y)); CK(cudaFree(dids)); CK(cudaFree(work));
      }
      CK(cudaFree(wg)); CK(cudaFree(wu)); CK(cudaFree(wd));
      if (sg) { CK(cudaFree(sg)); CK(cudaFree(su)); CK(cudaFree(sd)); }
    }
  }
  std::fclose(csv);
  std::printf("\nbandwidths in GB/s (1e9 B/s), medians of %d repetitions; rows with quartiles: %s\n", reps, out_path);
  return 0;
}
