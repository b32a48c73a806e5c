// bench_standalone.cu: torch-free bandwidth benchmark of the per-slot and dedup CUDA kernels on
// every execution path, under several cache protocols, with an optional tuning sweep.
//
// For a GPU machine without a CUDA build of torch (scripts/gpu_check.sh runs it either way):
//   nvcc -std=c++17 -O3 -arch=sm_90 -I.. bench_standalone.cu ../expert_kernels.cu -o bench_standalone
//   ./bench_standalone OUT.csv [--reps R] [--warmup W] [--formats f32,bf16,int8_b32] [--ns 1,2,...]
//        [--protocols rotate,flush,clean] [--variants legacy,fused,fused-nopdl,fused-graph]
//        [--copies C] [--spin-cycles S] [--flush-mib F] [--read-mib R] [--sweep] name:N,H,I,m ...
// (shapes: moespec.models.PRESETS). Per shape, format, pass size n and protocol, one interleaved
// run times each variant's per-slot and dedup call and a read of 1 GiB (the GPU's read bandwidth
// in the same run), each call after a spin kernel that holds the stream while the host enqueues
// it (the CUDA events bracket GPU work only). Variants: the legacy three-launch path, the fused
// two-launch path with and without programmatic dependent launch, and the fused path replayed
// from a CUDA graph (stream capture). --sweep replaces them by fused-path tunings that each change
// one launch choice from the default (ring depths, warps per down block, gate/up blocks per SM,
// PDL), to pick defaults from one run.
// Protocols (how the weights get out of the L2 between calls): flush = write and read 256 MiB
// (the L2 ends full of dirty lines that the call's reads must write back); clean = the same, then
// read another 256 MiB (the L2 ends with clean lines); rotate = no flush, C copies of the layer,
// every call takes the next copy.
// Before timing, every variant's output is compared bytewise with the first one's (the paths are
// bitwise equal by design); a difference is reported in the row's flags.
// CSV (long format, one row per protocol, variant and kernel): times (median, quartiles), requested
// bytes (per-slot n m b, dedup U b), bandwidth, the read bandwidth of the same run and the share
// of it, the launch plan. stdout: a markdown table, one line per (shape, format, n, protocol).
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

cudaStream_t g_stream;
int g_blocks = 4096;  // grid of the fill / flush / read kernels: 32 blocks per SM

template <class K, class... A>
void grid_launch(K kern, A... args) {
  kern<<<g_blocks, 256, 0, g_stream>>>(args...);
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

struct Variant {
  std::string name;
  moespec_cuda_tuning t;
  bool graph;
};

moespec_cuda_tuning tune(int path, int pdl, int ring_gu = 0, int ring_dn = 0, int dn_warps = 0, int gu_bps = 0) {
  moespec_cuda_tuning t{};
  t.path = path; t.pdl = pdl; t.ring_gu = ring_gu; t.ring_dn = ring_dn; t.dn_warps = dn_warps;
  t.gu_blocks_per_sm = gu_bps;
  return t;
}

std::vector<Variant> named_variants() {
  return {{"legacy", tune(MOESPEC_PATH_LEGACY, 0), false},
          {"fused", tune(MOESPEC_PATH_FUSED, -1), false},
          {"fused-nopdl", tune(MOESPEC_PATH_FUSED, 0), false},
          {"fused-graph", tune(MOESPEC_PATH_FUSED, -1), true}};
}

// One launch choice at a time changed from the fused path's defaults (rings 4/6, 4 down warps,
// gate/up blocks sized for 4 per SM, PDL on sm_90).
std::vector<Variant> sweep_variants() {
  const int F = MOESPEC_PATH_FUSED;
  return {{"default", tune(F, -1), false},        {"pdl0", tune(F, 0), false},
          {"gu_ring2", tune(F, -1, 2), false},     {"gu_ring3", tune(F, -1, 3), false},
          {"gu_ring6", tune(F, -1, 6), false},     {"gu_ring8", tune(F, -1, 8), false},
          {"dn_ring3", tune(F, -1, 0, 3), false},  {"dn_ring4", tune(F, -1, 0, 4), false},
          {"dn_ring8", tune(F, -1, 0, 8), false},  {"dn_warps2", tune(F, -1, 0, 0, 2), false},
          {"dn_warps8", tune(F, -1, 0, 0, 8), false}, {"gu_bps2", tune(F, -1, 0, 0, 0, 2), false},
          {"gu_bps8", tune(F, -1, 0, 0, 0, 8), false}, {"legacy", tune(MOESPEC_PATH_LEGACY, 0), false}};
}

std::string plan_text(const moespec_cuda_plan& q) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "%s %d launches gu %dx%d dn %dx%d%s", q.path == MOESPEC_PATH_FUSED ? "fused" : "legacy",
                q.launches, q.grid_gu_x, q.grid_gu_y, q.grid_dn_x, q.grid_dn_y, "");
  std::string s = buf;
  if (q.path == MOESPEC_PATH_FUSED) {
    std::snprintf(buf, sizeof buf, " rings %d/%d warps %d pdl %d", q.ring_gu, q.ring_dn, q.threads_dn / 32, q.pdl);
    s += buf;
  }
  return s;
}

std::vector<std::string> split(const std::string& v) {
  std::vector<std::string> out;
  for (size_t p = 0; p <= v.size();) {
    const size_t c = std::min(v.find(',', p), v.size());
    if (c > p) out.push_back(v.substr(p, c - p));
    p = c + 1;
  }
  return out;
}

struct Weights {
  void *wg, *wu, *wd;
  float *sg, *su, *sd;
};

Weights make_weights(const Shape& s, int fmt, uint32_t seed) {
  const size_t gu = (size_t)s.N * s.I * s.H, dn = (size_t)s.N * s.H * s.I;
  const size_t esz = fmt == MOESPEC_W_F32 ? 4 : (fmt == MOESPEC_W_BF16 ? 2 : 1);
  Weights w{};
  CK(cudaMalloc(&w.wg, gu * esz));
  CK(cudaMalloc(&w.wu, gu * esz));
  CK(cudaMalloc(&w.wd, dn * esz));
  void* ws[3] = {w.wg, w.wu, w.wd};
  const size_t cnt[3] = {gu, gu, dn};
  const int K[3] = {s.H, s.H, s.I};
  for (int j = 0; j < 3; ++j) {
    const float a = std::sqrt(3.0f / K[j]);
    if (fmt == MOESPEC_W_F32) grid_launch(fill_f32, (float*)ws[j], cnt[j], seed + j, a);
    else if (fmt == MOESPEC_W_BF16) grid_launch(fill_bf16, (uint16_t*)ws[j], cnt[j], seed + j, a);
    else grid_launch(fill_i8, (int8_t*)ws[j], cnt[j], seed + j);
  }
  if (fmt == MOESPEC_W_I8B32) {
    float** sp[3] = {&w.sg, &w.su, &w.sd};
    for (int j = 0; j < 3; ++j) {
      CK(cudaMalloc(sp[j], cnt[j] / 32 * 4));
      grid_launch(fill_scale, *sp[j], cnt[j] / 32, seed + 10 + j, std::sqrt(3.0f / K[j]) / 127.0f);
    }
  }
  return w;
}

void free_weights(Weights& w) {
  CK(cudaFree(w.wg)); CK(cudaFree(w.wu)); CK(cudaFree(w.wd));
  if (w.sg) { CK(cudaFree(w.sg)); CK(cudaFree(w.su)); CK(cudaFree(w.sd)); }
}

int die_status(int st) {
  std::fprintf(stderr, "%s\n", moespec_cuda_status_string(st));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT.csv [--reps R] [--warmup W] [--formats f32,bf16,int8_b32] [--ns 1,2,..] "
                         "[--protocols rotate,flush,clean] [--variants legacy,fused,fused-nopdl,fused-graph] "
                         "[--copies C] [--spin-cycles S] [--flush-mib F] [--read-mib R] [--sweep] name:N,H,I,m ...\n",
                 argv[0]);
    return 2;
  }
  const char* out_path = argv[1];
  int reps = 30, warmup = 3, copies = 3;
  long long spin_cycles = 200000;  // ~0.1 ms at 2 GHz: longer than the host needs to enqueue a call
  size_t flush_bytes = 256u << 20, read_bytes = 1u << 30;
  bool sweep = false;
  std::vector<int> fmts = {MOESPEC_W_F32, MOESPEC_W_BF16, MOESPEC_W_I8B32}, ns = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<std::string> protocols = {"rotate", "flush"}, vnames = {"legacy", "fused", "fused-nopdl", "fused-graph"};
  std::vector<Shape> shapes;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--sweep") { sweep = true; continue; }
    if (a.rfind("--", 0) == 0) {
      if (i + 1 >= argc) { std::fprintf(stderr, "%s needs a value\n", a.c_str()); return 2; }
      const std::string v = argv[++i];
      if (a == "--reps") reps = std::atoi(v.c_str());
      else if (a == "--warmup") warmup = std::atoi(v.c_str());
      else if (a == "--copies") copies = std::atoi(v.c_str());
      else if (a == "--spin-cycles") spin_cycles = std::atoll(v.c_str());
      else if (a == "--flush-mib") flush_bytes = (size_t)std::atoi(v.c_str()) << 20;
      else if (a == "--read-mib") read_bytes = (size_t)std::atoi(v.c_str()) << 20;
      else if (a == "--protocols") protocols = split(v);
      else if (a == "--variants") vnames = split(v);
      else if (a == "--formats") {
        fmts.clear();
        for (const std::string& f : split(v)) {
          if (f == "f32") fmts.push_back(MOESPEC_W_F32);
          else if (f == "bf16") fmts.push_back(MOESPEC_W_BF16);
          else if (f == "int8_b32") fmts.push_back(MOESPEC_W_I8B32);
          else { std::fprintf(stderr, "unknown format %s (f32, bf16, int8_b32)\n", f.c_str()); return 2; }
        }
      } else if (a == "--ns") {
        ns.clear();
        for (const std::string& t : split(v)) ns.push_back(std::atoi(t.c_str()));
      } else {
        std::fprintf(stderr, "unknown option %s\n", a.c_str());
        return 2;
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
  std::vector<Variant> vars;
  if (sweep) {
    vars = sweep_variants();
  } else {
    for (const std::string& nm : vnames) {
      bool found = false;
      for (const Variant& v : named_variants())
        if (v.name == nm) { vars.push_back(v); found = true; }
      if (!found) { std::fprintf(stderr, "unknown variant %s (legacy, fused, fused-nopdl, fused-graph)\n", nm.c_str()); return 2; }
    }
  }
  for (const std::string& p : protocols)
    if (p != "rotate" && p != "flush" && p != "clean") {
      std::fprintf(stderr, "unknown protocol %s (rotate, flush, clean)\n", p.c_str());
      return 2;
    }
  if (shapes.empty() || reps < 1 || fmts.empty() || vars.empty() || protocols.empty() || copies < 2 || ns.empty() ||
      flush_bytes < (1u << 20) || read_bytes < (1u << 20)) {
    std::fprintf(stderr, "nothing to measure (shapes, --reps >= 1, --formats, --variants, --protocols, --copies >= 2, "
                         "--flush-mib and --read-mib >= 1)\n");
    return 2;
  }
  for (int n : ns)
    if (n < 1) { std::fprintf(stderr, "pass sizes must be >= 1\n"); return 2; }
  FILE* csv = std::fopen(out_path, "w");
  if (!csv) {
    std::fprintf(stderr, "cannot write %s\n", out_path);
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  CK(cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking));
  g_blocks = 32 * prop.multiProcessorCount;
  std::printf("device: %s (sm_%d%d, %d SMs, L2 %d MiB)\n", prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  std::fprintf(csv, "model,fmt,n,m,N,H,I,U,expert_bytes,protocol,variant,kernel,graph,bytes,t_s,t_q25_s,t_q75_s,"
                    "beta_GBps,t_read_s,beta_read_GBps,of_read,plan,reps,gpu,flags\n");

  int4 *flush_buf = nullptr, *clean_buf = nullptr;
  float4* read_buf = nullptr;
  float* sink = nullptr;
  CK(cudaMalloc(&flush_buf, flush_bytes));
  CK(cudaMalloc(&clean_buf, flush_bytes));
  CK(cudaMalloc(&read_buf, read_bytes));
  CK(cudaMalloc(&sink, 4));
  CK(cudaMemset(flush_buf, 0, flush_bytes));
  CK(cudaMemset(clean_buf, 0, flush_bytes));
  grid_launch(fill_f32, reinterpret_cast<float*>(read_buf), read_bytes / 16 * 4, 7u, 1.0f);
  cudaEvent_t ev0, ev1;
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  const char* fmt_names[] = {"f32", "bf16", "int8_b32"};

  std::printf("\nshare of the same-run read bandwidth, slot / dedup (r = beta_dedup / beta_slot); read in GB/s\n\n"
              "| model | fmt | n | U | protocol | read |");
  for (const Variant& v : vars) std::printf(" %s slot | %s dedup | r %s |", v.name.c_str(), v.name.c_str(), v.name.c_str());
  std::printf(" flags |\n|---|---|---|---|---|---|");
  for (size_t i = 0; i < vars.size(); ++i) std::printf("---|---|---|");
  std::printf("---|\n");

  for (const Shape& s : shapes) {
    for (int fmt : fmts) {
      const bool rot = std::find(protocols.begin(), protocols.end(), "rotate") != protocols.end();
      std::vector<Weights> ws;
      for (int c = 0; c < (rot ? copies : 1); ++c) ws.push_back(make_weights(s, fmt, 11u + 97u * c));
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
        auto args_for = [&](const Weights& w) {
          moespec_expert_args a{};
          a.n = n; a.m = s.m; a.N = s.N; a.H = s.H; a.I = s.I;
          a.x = x; a.ids = dids; a.gates = gates; a.w_fmt = fmt;
          a.w_gate = w.wg; a.w_up = w.wu; a.w_down = w.wd; a.s_gate = w.sg; a.s_up = w.su; a.s_down = w.sd; a.y = y;
          return a;
        };
        size_t wbytes = 0;
        for (int k = 0; k < 2; ++k) {
          moespec_expert_args a = args_for(ws[0]);
          size_t bk = 0;
          const int st = moespec_cuda_workspace_bytes(&a, k, &bk);
          if (st) die_status(st);
          wbytes = std::max(wbytes, bk);
        }
        void* work = nullptr;
        CK(cudaMalloc(&work, wbytes));

        // The calls of one round: every variant x kernel (graphs per weight copy), then the read.
        struct Call {
          int var, kernel;
          std::vector<cudaGraphExec_t> graphs;  // per copy, graph variants only
          std::string plan;
        };
        std::vector<Call> calls;
        std::string flags;
        std::vector<float> first, cur((size_t)n * s.H);
        for (int v = 0; v < (int)vars.size(); ++v)
          for (int k = 0; k < 2; ++k) {
            Call c{v, k, {}, ""};
            if (moespec_cuda_set_tuning(&vars[v].t) != MOESPEC_OK) die_status(MOESPEC_ERR_TUNING);
            moespec_expert_args a = args_for(ws[0]);
            a.workspace = work;
            a.workspace_bytes = wbytes;
            moespec_cuda_plan q{};
            int st = moespec_cuda_get_plan(&a, k, &q);
            if (st) die_status(st);
            c.plan = plan_text(q);
            st = moespec_cuda_expert_forward(&a, k, g_stream);  // warm-up, opt-ins, and the output check
            if (st) die_status(st);
            CK(cudaStreamSynchronize(g_stream));
            CK(cudaMemcpy(cur.data(), y, sizeof(float) * cur.size(), cudaMemcpyDeviceToHost));
            if (first.empty()) first = cur;
            else if (std::memcmp(first.data(), cur.data(), sizeof(float) * cur.size()) != 0)
              flags += vars[v].name + (k ? "/dedup" : "/slot") + " differs;";
            if (vars[v].graph) {
              for (const Weights& w : ws) {
                moespec_expert_args aw = args_for(w);
                aw.workspace = work;
                aw.workspace_bytes = wbytes;
                cudaGraph_t graph;
                cudaGraphExec_t exec;
                CK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
                st = moespec_cuda_expert_forward(&aw, k, g_stream);
                const cudaError_t end = cudaStreamEndCapture(g_stream, &graph);
                if (st || end != cudaSuccess) {
                  flags += vars[v].name + " capture failed: " + (st ? moespec_cuda_status_string(st) : cudaGetErrorString(end)) + ";";
                  break;
                }
                CK(cudaGraphInstantiate(&exec, graph, 0));
                CK(cudaGraphDestroy(graph));
                c.graphs.push_back(exec);
              }
              if (c.graphs.size() != ws.size()) continue;  // capture failed: not timed
            }
            calls.push_back(c);
          }

        for (const std::string& proto : protocols) {
          const bool rotate = proto == "rotate";
          std::vector<std::vector<double>> t(calls.size() + 1);
          size_t turn = 0;
          for (int r = -warmup; r < reps; ++r) {
            for (size_t ci = 0; ci <= calls.size(); ++ci) {  // interleaved: every call, then the read
              if (!rotate) grid_launch(flush_kernel, flush_buf, flush_bytes / 16);
              if (proto == "clean") grid_launch(read_kernel, (const float4*)clean_buf, flush_bytes / 16, sink);
              CK(cudaStreamSynchronize(g_stream));
              int st = 0;
              if (ci < calls.size()) {  // set the variant's tuning while the GPU is idle
                st = moespec_cuda_set_tuning(&vars[calls[ci].var].t);
                if (st) die_status(st);
              }
              spin_kernel<<<1, 1, 0, g_stream>>>(spin_cycles);
              CK(cudaEventRecord(ev0, g_stream));
              if (ci < calls.size()) {
                const Call& c = calls[ci];
                const size_t copy = rotate ? turn++ % ws.size() : 0;
                if (!c.graphs.empty()) {
                  CK(cudaGraphLaunch(c.graphs[copy], g_stream));
                } else {
                  moespec_expert_args a = args_for(ws[copy]);
                  a.workspace = work;
                  a.workspace_bytes = wbytes;
                  st = moespec_cuda_expert_forward(&a, c.kernel, g_stream);
                  if (st) die_status(st);
                }
              } else {
                grid_launch(read_kernel, (const float4*)read_buf, read_bytes / 16, sink);
              }
              CK(cudaEventRecord(ev1, g_stream));
              CK(cudaEventSynchronize(ev1));
              float ms = 0.f;
              CK(cudaEventElapsedTime(&ms, ev0, ev1));
              if (r >= 0) t[ci].push_back(ms * 1e-3);
            }
          }
          const Stats tr = stats(t[calls.size()]);
          const double br = read_bytes / tr.med;
          std::vector<double> share(2 * vars.size(), -1);
          for (size_t ci = 0; ci < calls.size(); ++ci) {
            const Call& c = calls[ci];
            const Stats ts = stats(t[ci]);
            const double bytes = c.kernel ? U * b : (double)n * s.m * b, beta = bytes / ts.med;
            share[2 * c.var + c.kernel] = beta / br;
            std::fprintf(csv, "%s,%s,%d,%d,%d,%d,%d,%d,%.0f,%s,%s,%s,%d,%.0f,%.9g,%.9g,%.9g,%.2f,%.9g,%.2f,%.5f,%s,%d,%s,%s\n",
                         s.name.c_str(), fmt_names[fmt], n, s.m, s.N, s.H, s.I, U, b, proto.c_str(),
                         vars[c.var].name.c_str(), c.kernel ? "dedup" : "slot", vars[c.var].graph ? 1 : 0, bytes, ts.med,
                         ts.q25, ts.q75, beta / 1e9, tr.med, br / 1e9, beta / br, c.plan.c_str(), reps, prop.name,
                         flags.c_str());
          }
          std::fflush(csv);
          std::printf("| %s | %s | %d | %d | %s | %.0f |", s.name.c_str(), fmt_names[fmt], n, U, proto.c_str(), br / 1e9);
          for (size_t v = 0; v < vars.size(); ++v) {
            const double sl = share[2 * v], de = share[2 * v + 1];
            if (sl < 0 || de < 0) { std::printf(" | | |"); continue; }
            // r = beta_dedup / beta_slot = (dedup share) / (slot share): the read cancels
            std::printf(" %.2f | %.2f | %.3f |", sl, de, de / sl);
          }
          std::printf(" %s |\n", flags.c_str());
          std::fflush(stdout);
        }
        for (Call& c : calls)
          for (cudaGraphExec_t g : c.graphs) CK(cudaGraphExecDestroy(g));
        CK(cudaFree(x)); CK(cudaFree(gates)); CK(cudaFree(y)); CK(cudaFree(dids)); CK(cudaFree(work));
      }
      for (Weights& w : ws) free_weights(w);
    }
  }
  std::fclose(csv);
  std::printf("\nmedians of %d repetitions (%d warm-up rounds); spin %lld cycles; flush %zu MiB; read %zu MiB; "
              "%d copies (rotate); rows with quartiles and plans: %s\n",
              reps, warmup, spin_cycles, flush_bytes >> 20, read_bytes >> 20, copies, out_path);
  return 0;
}
