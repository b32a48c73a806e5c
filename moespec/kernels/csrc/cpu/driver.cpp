// The driver shared by both kernels (paper 1, Section 1): one call of the expert operation.
//
// The pass's (token, slot) pairs ("assignments", a = t*m + s) are split into groups, each group one
// expert read:
//   * per-slot: one group per assignment, in token order -> n*m expert reads (llama.cpp mul_mv_id);
//   * dedup:    one group per distinct expert holding all of its assignments -> U expert reads.
// For every weight row a group streams once, a multi-token dot kernel (dot.h) accumulates the dot
// products of up to TMAX = 9 tokens in registers (the row is loaded once, each token's activation
// chunk is an L1 hit). Work items are (group, matrix, block of rows), dealt into one lane per
// thread (a contiguous share of every matrix's rows); a thread takes its own lane in order and then
// steals from the others (thread_pool.h), so each streams long contiguous runs and a descheduled
// thread does not stall the rest. docs/kernels.md, "CPU extension", has the design; docs/decisions.md,
// "Lab notes: the CPU kernels", the measurements behind it.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>

#include <limits>

#include "activations.h"
#include "dot.h"
#include "ops.h"
#include "stage_clock.h"
#include "thread_pool.h"

namespace moespec {

// Tuning knob, read from the environment at each call (benchmarks use it to compare settings;
// the default is the measured best): bytes of one matrix's rows per work item.
static int64_t g_item_bytes = 256 * 1024;

// Scratch memory of one calling thread, kept between calls instead of allocated per call (the
// larger buffers, e.g. W_down h at n = 9: 72 x 2048 floats, came as fresh pages to fault in and
// went back to the OS after the call). It grows to the largest pass seen and is not shrunk.
struct Workspace {
  Acts ax, ah;                      // activations x [n, H] and h [n*m, I] in the format's layout
  AlignedVector<float> gbuf, ubuf;  // W_gate x, W_up x per assignment [n*m, I]
  AlignedVector<float> obuf;        // W_down h per assignment [n*m, H]
};
static Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// Input checks (the Python layer checks first; these keep a direct op call from crashing).
static void check_inputs(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                         const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                         const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                         const c10::optional<at::Tensor>& sd, int fmt) {
  TORCH_CHECK(x.device().is_cpu() && ids.device().is_cpu() && wg.device().is_cpu() && wu.device().is_cpu() &&
                  wd.device().is_cpu(), "moespec CPU op: every tensor must be on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(0) >= 1,
              "x: expected a contiguous float32 [n, H] tensor with n >= 1, found ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong && ids.is_contiguous() && ids.size(0) == x.size(0),
              "ids: expected a contiguous int64 [n, m] tensor with n = ", x.size(0), ", found ", ids.scalar_type(),
              " ", ids.sizes());
  TORCH_CHECK(wg.dim() == 3 && wu.sizes() == wg.sizes() && wd.dim() == 3, "w_gate, w_up: [N, I, H]; w_down: [N, H, I]");
  const int64_t N = wg.size(0), I = wg.size(1), H = wg.size(2);
  TORCH_CHECK(x.size(1) == H, "x: hidden size ", x.size(1), " does not match the weights' H = ", H);
  TORCH_CHECK(wd.size(0) == N && wd.size(1) == H && wd.size(2) == I, "w_down: expected [", N, ", ", H, ", ", I,
              "], found ", wd.sizes());
  TORCH_CHECK(wg.scalar_type() == wu.scalar_type() && wg.scalar_type() == wd.scalar_type(),
              "w_gate, w_up, w_down must share a dtype");
  TORCH_CHECK(wg.is_contiguous() && wu.is_contiguous() && wd.is_contiguous(), "expert weights must be contiguous");
  TORCH_CHECK(ids.size(1) >= 1 && ids.size(1) <= N, "ids: m = ", ids.size(1), " must be in [1, N = ", N, "]");
  if (gates.has_value()) {
    const auto& g = *gates;
    TORCH_CHECK(g.device().is_cpu() && g.scalar_type() == at::kFloat && g.is_contiguous() && g.sizes() == ids.sizes(),
                "gates: expected a contiguous float32 CPU tensor shaped like ids ", ids.sizes(), ", found ",
                g.scalar_type(), " ", g.sizes());
  }
  if (fmt == I8) {
    TORCH_CHECK(H % BLK == 0 && I % BLK == 0, "int8 weights need H and I multiples of 32; found H = ", H, ", I = ", I);
    TORCH_CHECK(sg.has_value() && su.has_value() && sd.has_value(), "int8 weights need s_gate, s_up and s_down");
    const std::vector<std::pair<const at::Tensor*, std::vector<int64_t>>> want = {
        {&*sg, {N, I, H / BLK}}, {&*su, {N, I, H / BLK}}, {&*sd, {N, H, I / BLK}}};
    for (const auto& p : want)
      TORCH_CHECK(p.first->device().is_cpu() && p.first->scalar_type() == at::kFloat && p.first->is_contiguous() &&
                      p.first->sizes() == at::IntArrayRef(p.second),
                  "int8 scales: expected contiguous float32 ", at::IntArrayRef(p.second), ", found ",
                  p.first->scalar_type(), " ", p.first->sizes());
  } else {
    TORCH_CHECK(!sg.has_value() && !su.has_value() && !sd.has_value(), "scales are only taken with int8 weights");
  }
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t n = ids.size(0), m = ids.size(1);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s < m; ++s) {
      TORCH_CHECK(id[t * m + s] >= 0 && id[t * m + s] < N, "ids[", t, ", ", s, "] = ", id[t * m + s],
                  " is outside [0, ", N, ")");
      for (int64_t s2 = 0; s2 < s; ++s2)
        TORCH_CHECK(id[t * m + s2] != id[t * m + s], "ids: token ", t, " selects expert ", id[t * m + s], " twice");
    }
}

struct Group {
  int64_t expert;
  int64_t first;  // into the assignment list
  int64_t count;
};

at::Tensor expert_op(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                     const at::Tensor& wg_in, const at::Tensor& wu_in, const at::Tensor& wd_in,
                     const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                     const c10::optional<at::Tensor>& sd, bool dedup) {
  const bool clock_on = g_stage_clock.load(std::memory_order_relaxed);
  StageTimes st;
  if (clock_on) st.entry = clock_ns();
  std::atomic<int64_t> first_item{0};
  const auto dt = wg_in.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kChar || dt == at::kByte,
              "expert weights: expected float32, bfloat16, int8 (plain) or uint8 (pack_int8_cpu layout), found ", dt);
  const int fmt = dt == at::kFloat ? F32 : (dt == at::kBFloat16 ? BF16 : I8);
  check_inputs(x, ids, gates, wg_in, wu_in, wd_in, sg, su, sd, fmt);
  // Plain int8 is accepted but repacked here, every call; callers keep the packed copy instead.
  at::Tensor wg = dt == at::kChar ? pack_int8_cpu(wg_in) : wg_in;
  at::Tensor wu = dt == at::kChar ? pack_int8_cpu(wu_in) : wu_in;
  at::Tensor wd = dt == at::kChar ? pack_int8_cpu(wd_in) : wd_in;

  const int64_t n = x.size(0), H = x.size(1), m = ids.size(1), I = wg.size(1), A = n * m;
  const int64_t esize = element_bytes(fmt);
  const int isa = isa_for(fmt);
  const DotFn dot = dot_for(fmt, isa);
  const int64_t* id = ids.data_ptr<int64_t>();

  // Groups: per-slot -> one per assignment in token order; dedup -> one per distinct expert.
  std::vector<int64_t> assign(A);
  std::vector<Group> groups;
  if (!dedup) {
    for (int64_t a = 0; a < A; ++a) {
      assign[a] = a;
      groups.push_back({id[a], a, 1});
    }
  } else {
    for (int64_t a = 0; a < A; ++a) assign[a] = a;
    std::stable_sort(assign.begin(), assign.end(), [&](int64_t p, int64_t q) { return id[p] < id[q]; });
    for (int64_t i = 0; i < A; ++i) {
      if (i == 0 || id[assign[i]] != id[assign[i - 1]]) groups.push_back({id[assign[i]], i, 0});
      groups.back().count++;
    }
  }

  Workspace& ws = workspace();
  Acts& ax = ws.ax;
  Acts& ah = ws.ah;
  ax.init(fmt, n, H, isa == AVX512);
  ah.init(fmt, A, I, isa == AVX512);
  const float* xp = x.data_ptr<float>();
  float* const gbuf = grown(ws.gbuf, A * I);
  float* const ubuf = grown(ws.ubuf, A * I);
  float* const obuf = grown(ws.obuf, A * H);
  // the output straight from the CPU allocator (at::zeros went through the dispatcher and a fill,
  // docs/decisions.md, "Lab notes"); step 4 writes every value
  at::Tensor y = at::detail::empty_cpu({n, H}, at::kFloat, false, c10::nullopt);
  float* yp = y.data_ptr<float>();
  const float* gp = gates.has_value() ? gates->data_ptr<float>() : nullptr;

  const uint8_t* Wg = (const uint8_t*)wg.data_ptr();
  const uint8_t* Wu = (const uint8_t*)wu.data_ptr();
  const uint8_t* Wd = (const uint8_t*)wd.data_ptr();
  const float* Sg = fmt == I8 ? sg->data_ptr<float>() : nullptr;
  const float* Su = fmt == I8 ? su->data_ptr<float>() : nullptr;
  const float* Sd = fmt == I8 ? sd->data_ptr<float>() : nullptr;

  // Work items: (group, matrix, block of rows of ~g_item_bytes): phase 1 = gate and up rows,
  // phase 3 = down rows. There is no barrier: on a shared, oversubscribed CPU a barrier waits for a
  // descheduled thread for a whole time slice, so each thread only waits where data is missing.
  // The thread finishing a group's last phase-1 item prepares the group's h (phase 2) and sets the
  // group's flag; the group's phase-3 items are claimed only after that. Lane l (one per thread)
  // holds the l-th contiguous share of every matrix's row blocks, phase 1 of all groups first.
  g_item_bytes = env_int("MOESPEC_CPU_ITEM_BYTES", 256 * 1024);
  const int64_t rows1 = std::max<int64_t>(1, g_item_bytes / (H * esize));
  const int64_t rows2 = std::max<int64_t>(1, g_item_bytes / (I * esize));
  const int64_t ng = (int64_t)groups.size();
  const int64_t nb1 = (I + rows1 - 1) / rows1, nb2 = (H + rows2 - 1) / rows2;
  const int64_t items1 = ng * 2 * nb1, items = items1 + ng * nb2;  // phase-1 id = (g*2 + mat)*nb1 + block
  const int nt = std::max(1, std::min<int>(at::get_num_threads(), (int)std::max<int64_t>(1, items / 4)));
  std::vector<std::vector<int64_t>> lanes(nt);
  std::vector<int64_t> dep(items, -1);
  // Groups by token count, most first; even lanes take them in that order, odd lanes in reverse, so
  // that a thread on a group whose arithmetic outlasts its reads (several tokens) runs beside one
  // that only streams.
  std::vector<int64_t> order(ng);
  for (int64_t g = 0; g < ng; ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return groups[p].count > groups[q].count; });
  for (int l = 0; l < nt; ++l) {
    auto group_at = [&](int64_t k) { return order[l % 2 ? ng - 1 - k : k]; };
    for (int64_t k = 0; k < ng; ++k)
      for (int64_t mat = 0, g = group_at(k); mat < 2; ++mat)
        for (int64_t j = l * nb1 / nt; j < (l + 1) * nb1 / nt; ++j) lanes[l].push_back((g * 2 + mat) * nb1 + j);
    for (int64_t k = 0; k < ng; ++k)
      for (int64_t j = l * nb2 / nt, g = group_at(k); j < (l + 1) * nb2 / nt; ++j) lanes[l].push_back(items1 + g * nb2 + j);
  }
  for (int64_t it = items1; it < items; ++it) dep[it] = (it - items1) / nb2;
  auto job = std::make_shared<Job>(std::move(lanes), std::move(dep), ng);
  std::vector<std::atomic<int64_t>> done1(ng);
  for (int64_t g = 0; g < ng; ++g) done1[g].store(0, std::memory_order_relaxed);
  for (int64_t t = 0; t < n; ++t) ax.set_row(t, xp + t * H);  // n <= a few rows: serial

  Job* jp = job.get();
  job->item = [&, jp](int64_t it) {
    if (clock_on && first_item.load(std::memory_order_relaxed) == 0) {
      int64_t none = 0;
      first_item.compare_exchange_strong(none, clock_ns(), std::memory_order_relaxed);
    }
    ActRef refs[TMAX];
    float* outs[TMAX];
    if (it < items1) {
      // 1. gate or up rows for every assignment of the group: g = W_gate x, u = W_up x
      const int64_t gi = it / (2 * nb1), mat = (it / nb1) % 2;
      const Group& G = groups[gi];
      const int64_t r0 = (it % nb1) * rows1, r1 = std::min(I, r0 + rows1);
      const uint8_t* W = mat == 0 ? Wg : Wu;
      const float* S = mat == 0 ? Sg : Su;
      float* dst = mat == 0 ? gbuf : ubuf;
      for (int64_t t0 = 0; t0 < G.count; t0 += TMAX) {
        const int T = (int)std::min<int64_t>(TMAX, G.count - t0);
        for (int j = 0; j < T; ++j) refs[j] = ax.refs[assign[G.first + t0 + j] / m];
        for (int j = 0; j < T; ++j) outs[j] = dst + assign[G.first + t0 + j] * I + r0;
        dot_rows(dot, W, S, esize, H, G.expert * I + r0, r1 - r0, refs, T, outs);
      }
      if (done1[gi].fetch_add(1, std::memory_order_acq_rel) == 2 * nb1 - 1) {
        // 2. h = silu(g) * u in the format's activation layout, for the group's assignments
        for (int64_t j = 0; j < G.count; ++j) {
          const int64_t a = assign[G.first + j];
          float* g = gbuf + a * I;
          const float* u = ubuf + a * I;
          silu_mul(g, u, I, isa == AVX512);
          ah.set_row(a, g);
        }
        jp->set(gi);
      }
    } else {
      // 3. down rows: o_a = W_down h_a (claimed only once the group's h is ready)
      const int64_t gi = (it - items1) / nb2;
      const Group& G = groups[gi];
      const int64_t r0 = ((it - items1) % nb2) * rows2, r1 = std::min(H, r0 + rows2);
      for (int64_t t0 = 0; t0 < G.count; t0 += TMAX) {
        const int T = (int)std::min<int64_t>(TMAX, G.count - t0);
        for (int j = 0; j < T; ++j) refs[j] = ah.refs[assign[G.first + t0 + j]];
        for (int j = 0; j < T; ++j) outs[j] = obuf + assign[G.first + t0 + j] * H + r0;
        dot_rows(dot, Wd, Sd, esize, I, G.expert * H + r0, r1 - r0, refs, T, outs);
      }
    }
  };
  if (clock_on) st.setup_done = clock_ns();
  run_job(job, nt);
  if (clock_on) st.work_done = clock_ns();
  // 4. y_t = sum_s g_ts o_{t*m+s} (n*m*H flops: serial), then the non-finite rule (docs/kernels.md):
  // a token whose x row or gates hold NaN or +-inf, or whose float32 computation overflowed (a
  // non-finite value anywhere in y_t), gets y_t all NaN; every other row is untouched.
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < m; ++s) {
      const float gt = gp ? gp[t * m + s] : 1.0f;
      const float* o = obuf + (t * m + s) * H;
      if (s == 0)
        for (int64_t r = 0; r < H; ++r) yp[t * H + r] = gt * o[r];
      else
        for (int64_t r = 0; r < H; ++r) yp[t * H + r] += gt * o[r];
    }
    if (!all_finite(yp + t * H, H) || !all_finite(xp + t * H, H) || (gp && !all_finite(gp + t * m, m)))
      std::fill(yp + t * H, yp + (t + 1) * H, std::numeric_limits<float>::quiet_NaN());
  }
  if (clock_on) {
    st.first_item = first_item.load(std::memory_order_relaxed);
    st.exit = clock_ns();
    g_last_stages = st;
  }
  return y;
}

}  // namespace moespec
