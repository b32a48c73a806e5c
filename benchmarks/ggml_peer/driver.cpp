// The ggml peer: llama.cpp's MoE expert FFN on ggml's own CPU backend, behind a small C API.
//
// It builds the graph llama.cpp's build_moe_ffn builds for a SwiGLU MoE layer (llama-graph.cpp):
//   gate = ggml_mul_mat_id(gate_exps, x, ids)       [I, m, n]
//   up   = ggml_mul_mat_id(up_exps,   x, ids)       [I, m, n]
//   h    = ggml_swiglu_split(gate, up)              silu(gate) * up
//   e    = ggml_mul_mat_id(down_exps, h, ids)       [H, m, n]
//   e    = ggml_mul(e, weights)                     routing weights [1, m, n]
//   y    = e[:, 0, :] + e[:, 1, :] + ...            ggml_view_2d + ggml_add over the m slots
// and computes it with ggml_graph_plan + ggml_graph_compute, the calls ggml's CPU backend makes
// (ggml_backend_cpu_graph_compute), with a persistent ggml threadpool of n_threads.
//
// Weights: gate/up are ggml tensors [H, I, N] (ne0 = H, the reduction dim), down [I, H, N]: the same
// memory order as moespec's [N, I, H] / [N, H, I]. They are filled once from float32 arrays with
// ggml's own converters (ggml_fp32_to_bf16_row for bf16, ggml_quantize_chunk for Q8_0), into one
// buffer mmap'ed once (optionally madvise'd for transparent huge pages, as torch's allocations are
// in moespec's benchmark), so the peer reads what moespec's kernels read, from the same page size.
// ggml's CPU "extra buffer" repacking is not used: on x86 it has no Q8_0/F32/BF16 repack (only
// ARM/RISC-V repack Q8_0), and AMX needs AMX hardware, so plain tensors are what llama.cpp runs here.
//
// One graph per (n tokens, m slots) is built on first use and cached (with its work buffer); a call
// copies x, ids and gates into the graph's input tensors, computes, and copies y out.

#include "ggml.h"
#include "ggml-cpu.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

namespace {

constexpr size_t kHuge = size_t(2) << 20;  // 2 MiB: each weight tensor starts on a huge page

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct Graph {
    ggml_context * ctx = nullptr;
    ggml_cgraph * gf = nullptr;
    ggml_tensor * x = nullptr;      // [H, 1, n] f32
    ggml_tensor * ids = nullptr;    // [m, n] i32
    ggml_tensor * gates = nullptr;  // [1, m, n] f32
    ggml_tensor * out = nullptr;    // [H, n] f32 (row stride out->nb[1])
    std::vector<uint8_t> work;
    ggml_cplan plan{};
};

struct Peer {
    ggml_type type = GGML_TYPE_F32;
    int64_t N = 0, H = 0, I = 0;
    int n_threads = 1;
    void * wbuf = nullptr;
    size_t wbuf_size = 0;
    ggml_context * wctx = nullptr;
    ggml_tensor * gate = nullptr;
    ggml_tensor * up = nullptr;
    ggml_tensor * down = nullptr;
    ggml_threadpool * tp = nullptr;
    std::map<std::pair<int64_t, int64_t>, Graph *> graphs;  // (n, m) -> graph, built on first use
    char error[512] = {0};
};

char g_error[512] = {0};  // create() failures (no handle yet)

ggml_type type_of(int fmt) {
    switch (fmt) {
        case 0: return GGML_TYPE_F32;
        case 1: return GGML_TYPE_BF16;
        case 2: return GGML_TYPE_Q8_0;
        default: return GGML_TYPE_COUNT;
    }
}

// Rows [nrows, k] of float32 into `dst` in `type`, with ggml's own converters.
void fill(ggml_type type, const float * src, void * dst, int64_t nrows, int64_t k) {
    if (type == GGML_TYPE_F32) {
        std::memcpy(dst, src, size_t(nrows * k) * sizeof(float));
    } else if (type == GGML_TYPE_BF16) {
        ggml_fp32_to_bf16_row(src, (ggml_bf16_t *) dst, nrows * k);
    } else {
        ggml_quantize_chunk(type, src, dst, 0, nrows, k, nullptr);
    }
}

Graph * build_graph(Peer * p, int64_t n, int64_t m) {
    const int64_t H = p->H, I = p->I;
    // data of every node of the graph, each padded, plus tensor and graph overheads
    const size_t f = sizeof(float);
    size_t data = f * size_t(n) * size_t(H + m + 3 * I * m + 2 * H * m + (m + 1) * H) + sizeof(int32_t) * n * m;
    size_t mem = data + 256 * (2 * m + 16) + (2 * m + 16) * ggml_tensor_overhead() + ggml_graph_overhead();
    ggml_init_params ip = {mem, nullptr, false};
    Graph * g = new Graph();
    g->ctx = ggml_init(ip);
    if (!g->ctx) {
        delete g;
        return nullptr;
    }
    ggml_context * c = g->ctx;
    g->x = ggml_new_tensor_3d(c, GGML_TYPE_F32, H, 1, n);
    g->ids = ggml_new_tensor_2d(c, GGML_TYPE_I32, m, n);
    g->gates = ggml_new_tensor_3d(c, GGML_TYPE_F32, 1, m, n);
    ggml_set_input(g->x);
    ggml_set_input(g->ids);
    ggml_set_input(g->gates);

    ggml_tensor * gate = ggml_mul_mat_id(c, p->gate, g->x, g->ids);  // [I, m, n]
    ggml_tensor * up = ggml_mul_mat_id(c, p->up, g->x, g->ids);      // [I, m, n]
    ggml_tensor * h = ggml_swiglu_split(c, gate, up);                // silu(gate) * up
    ggml_tensor * e = ggml_mul_mat_id(c, p->down, h, g->ids);        // [H, m, n]
    e = ggml_mul(c, e, g->gates);
    g->gf = ggml_new_graph(c);
    ggml_build_forward_expand(g->gf, e);
    ggml_tensor * y = ggml_view_2d(c, e, H, n, e->nb[2], 0);
    for (int64_t s = 1; s < m; ++s) {
        ggml_tensor * ys = ggml_view_2d(c, e, H, n, e->nb[2], size_t(s) * e->nb[1]);
        ggml_build_forward_expand(g->gf, ys);
        y = ggml_add(c, y, ys);
        ggml_build_forward_expand(g->gf, y);
    }
    ggml_build_forward_expand(g->gf, y);
    ggml_set_output(y);
    g->out = y;

    g->plan = ggml_graph_plan(g->gf, p->n_threads, p->tp);
    if (g->plan.work_size > 0) {
        g->work.resize(g->plan.work_size);
        g->plan.work_data = g->work.data();
    }
    return g;
}

void free_graph(Graph * g) {
    if (g) {
        ggml_free(g->ctx);
        delete g;
    }
}

}  // namespace

extern "C" {

// The last error of create() (handle NULL) or of a call on `handle`.
const char * ggml_peer_error(void * handle) {
    return handle ? static_cast<Peer *>(handle)->error : g_error;
}

// "ggml <version> (<commit>)", and the CPU features ggml was built with.
const char * ggml_peer_version(void) {
    static char buf[256];
    std::snprintf(buf, sizeof buf, "ggml %s (commit %s); avx512 %d, avx512_vnni %d, avx512_bf16 %d, avx2 %d",
                  ggml_version(), ggml_commit(), ggml_cpu_has_avx512(), ggml_cpu_has_avx512_vnni(),
                  ggml_cpu_has_avx512_bf16(), ggml_cpu_has_avx2());
    return buf;
}

// Bytes ggml stores for one expert (gate + up + down) in format fmt.
int64_t ggml_peer_expert_bytes(int fmt, int64_t H, int64_t I) {
    ggml_type t = type_of(fmt);
    if (t == GGML_TYPE_COUNT) return -1;
    return int64_t(2 * I * ggml_row_size(t, H) + H * ggml_row_size(t, I));
}

// A layer of N SwiGLU experts in format fmt (0 = f32, 1 = bf16, 2 = q8_0) from float32 weights
// gate, up [N, I, H] and down [N, H, I] (row-major, contiguous), computed with n_threads threads.
// hugepages != 0 madvises the weight buffer for transparent huge pages. Returns NULL on failure
// (ggml_peer_error(NULL) says why).
void * ggml_peer_create(int fmt, int64_t N, int64_t H, int64_t I, int n_threads, int hugepages,
                        const float * gate, const float * up, const float * down) {
    g_error[0] = 0;
    ggml_type type = type_of(fmt);
    if (type == GGML_TYPE_COUNT) {
        std::snprintf(g_error, sizeof g_error, "fmt %d: expected 0 (f32), 1 (bf16) or 2 (q8_0)", fmt);
        return nullptr;
    }
    if (N < 1 || H < 1 || I < 1 || n_threads < 1) {
        std::snprintf(g_error, sizeof g_error, "bad sizes N=%lld H=%lld I=%lld n_threads=%d",
                      (long long) N, (long long) H, (long long) I, n_threads);
        return nullptr;
    }
    const int64_t blk = ggml_blck_size(type);
    if (H % blk || I % blk) {
        std::snprintf(g_error, sizeof g_error, "%s needs H and I multiples of %lld; got H=%lld I=%lld",
                      ggml_type_name(type), (long long) blk, (long long) H, (long long) I);
        return nullptr;
    }
    if (!gate || !up || !down) {
        std::snprintf(g_error, sizeof g_error, "weight pointers must not be NULL");
        return nullptr;
    }
    ggml_cpu_init();

    Peer * p = new Peer();
    p->type = type;
    p->N = N; p->H = H; p->I = I; p->n_threads = n_threads;

    ggml_init_params ip = {4 * ggml_tensor_overhead(), nullptr, true};  // metadata only
    p->wctx = ggml_init(ip);
    p->gate = ggml_new_tensor_3d(p->wctx, type, H, I, N);
    p->up = ggml_new_tensor_3d(p->wctx, type, H, I, N);
    p->down = ggml_new_tensor_3d(p->wctx, type, I, H, N);
    ggml_set_name(p->gate, "ffn_gate_exps");
    ggml_set_name(p->up, "ffn_up_exps");
    ggml_set_name(p->down, "ffn_down_exps");

    const size_t sg = round_up(ggml_nbytes(p->gate), kHuge), sd = round_up(ggml_nbytes(p->down), kHuge);
    p->wbuf_size = 2 * sg + sd;
    void * buf = mmap(nullptr, p->wbuf_size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        std::snprintf(g_error, sizeof g_error, "mmap of %zu bytes for the weights failed", p->wbuf_size);
        ggml_free(p->wctx);
        delete p;
        return nullptr;
    }
    // align to 2 MiB inside the mapping; unmap the slack on both sides
    char * base = (char *) buf;
    char * aligned = (char *) round_up((uintptr_t) base, kHuge);
    if (aligned > base) munmap(base, aligned - base);
    char * end = base + p->wbuf_size + kHuge;
    if (end > aligned + p->wbuf_size) munmap(aligned + p->wbuf_size, end - (aligned + p->wbuf_size));
    p->wbuf = aligned;
    if (hugepages) madvise(p->wbuf, p->wbuf_size, MADV_HUGEPAGE);
    p->gate->data = aligned;
    p->up->data = aligned + sg;
    p->down->data = aligned + 2 * sg;

    for (int64_t e = 0; e < N; ++e) {  // per expert: ggml_quantize_chunk's start is per-row aligned
        fill(type, gate + e * I * H, (char *) p->gate->data + e * p->gate->nb[2], I, H);
        fill(type, up + e * I * H, (char *) p->up->data + e * p->up->nb[2], I, H);
        fill(type, down + e * H * I, (char *) p->down->data + e * p->down->nb[2], H, I);
    }

    ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    p->tp = ggml_threadpool_new(&tpp);
    return p;
}

// y [n, H] = the MoE expert FFN of x [n, H] routed to ids [n, m] (int32, each in [0, N)) with
// routing weights gates [n, m] (NULL = all ones). Returns 0, or -1 with ggml_peer_error(handle).
int ggml_peer_run(void * handle, int64_t n, int64_t m, const int32_t * ids, const float * x,
                  const float * gates, float * y) {
    Peer * p = static_cast<Peer *>(handle);
    if (!p) return -1;
    p->error[0] = 0;
    if (n < 1 || m < 1 || m > p->N) {
        std::snprintf(p->error, sizeof p->error, "n = %lld tokens, m = %lld slots: need n >= 1, 1 <= m <= N = %lld",
                      (long long) n, (long long) m, (long long) p->N);
        return -1;
    }
    for (int64_t i = 0; i < n * m; ++i) {  // ggml only asserts this in debug builds
        if (ids[i] < 0 || ids[i] >= p->N) {
            std::snprintf(p->error, sizeof p->error, "ids[%lld] = %d out of range [0, %lld)", (long long) i,
                          ids[i], (long long) p->N);
            return -1;
        }
    }
    Graph *& g = p->graphs[{n, m}];
    if (!g) {
        g = build_graph(p, n, m);
        if (!g) {
            std::snprintf(p->error, sizeof p->error, "could not allocate the graph for n = %lld", (long long) n);
            return -1;
        }
    }
    std::memcpy(g->x->data, x, size_t(n * p->H) * sizeof(float));
    std::memcpy(g->ids->data, ids, size_t(n * m) * sizeof(int32_t));
    float * gd = (float *) g->gates->data;
    for (int64_t i = 0; i < n * m; ++i) gd[i] = gates ? gates[i] : 1.0f;
    ggml_status st = ggml_graph_compute(g->gf, &g->plan);
    if (st != GGML_STATUS_SUCCESS) {
        std::snprintf(p->error, sizeof p->error, "ggml_graph_compute returned status %d", (int) st);
        return -1;
    }
    for (int64_t t = 0; t < n; ++t) {
        std::memcpy(y + t * p->H, (const char *) g->out->data + t * g->out->nb[1], size_t(p->H) * sizeof(float));
    }
    return 0;
}

// Bytes of the weight buffer (the three tensors, each padded to 2 MiB).
int64_t ggml_peer_weight_bytes(void * handle) {
    Peer * p = static_cast<Peer *>(handle);
    return p ? int64_t(ggml_nbytes(p->gate) + ggml_nbytes(p->up) + ggml_nbytes(p->down)) : -1;
}

void ggml_peer_destroy(void * handle) {
    Peer * p = static_cast<Peer *>(handle);
    if (!p) return;
    for (auto & kv : p->graphs) free_graph(kv.second);
    if (p->tp) ggml_threadpool_free(p->tp);
    if (p->wbuf) munmap(p->wbuf, p->wbuf_size);
    ggml_free(p->wctx);
    delete p;
}

}  // extern "C"
