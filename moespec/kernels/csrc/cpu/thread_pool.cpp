// The work queue and the helper threads (thread_pool.h).
#include "thread_pool.h"

#include <c10/util/Exception.h>
#include <immintrin.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>
#include <thread>

namespace moespec {

Job::Job(std::vector<std::vector<int64_t>> lanes_, std::vector<int64_t> dep_, int64_t nflags)
    : lanes(std::move(lanes_)), next(new std::atomic<int64_t>[lanes.size()]), dep(std::move(dep_)),
      flags(new std::atomic<int>[std::max<int64_t>(1, nflags)]) {
  for (size_t l = 0; l < lanes.size(); ++l) next[l].store(0, std::memory_order_relaxed), items += (int64_t)lanes[l].size();
  for (int64_t f = 0; f < nflags; ++f) flags[f].store(0, std::memory_order_relaxed);
}

int64_t Job::claim(size_t home) {
  bool left = false;
  for (size_t k = 0; k < lanes.size(); ++k) {
    const size_t l = (home + k) % lanes.size();
    int64_t i = next[l].load(std::memory_order_acquire);
    while (i < (int64_t)lanes[l].size()) {
      left = true;
      const int64_t id = lanes[l][i];
      if (dep[id] >= 0 && !flags[dep[id]].load(std::memory_order_acquire)) break;
      if (next[l].compare_exchange_weak(i, i + 1, std::memory_order_acq_rel)) return id;
    }
  }
  return left ? -2 : -1;
}

void Job::work(size_t home) {
  for (int spins = 0;;) {
    const int64_t id = claim(home);
    if (id == -1) return;
    if (id == -2) {  // the flag's item runs on another thread
      if (++spins < 64) _mm_pause(); else sched_yield();
      continue;
    }
    spins = 0;
    item(id);
    done.fetch_add(1, std::memory_order_acq_rel);
  }
}

Pool& Pool::get() {
  static Pool* pool = new Pool();  // never destroyed: helpers are detached and outlive main()
  return *pool;
}

void Pool::run(const std::shared_ptr<Job>& job, int helpers) {
  job->seats.store(helpers, std::memory_order_relaxed);
  if (helpers > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    while ((int)threads_ < helpers) {
      std::thread(&Pool::loop, this).detach();
      ++threads_;
    }
    job_ = job;
    ++gen_;
    cv_.notify_all();
  }
  job->work(0);
  for (int spins = 0; job->done.load(std::memory_order_acquire) < job->items; ++spins) {
    if (spins < 256) _mm_pause(); else sched_yield();  // an item still held by a helper
  }
  if (helpers > 0) {
    std::lock_guard<std::mutex> lk(mu_);
    if (job_ == job) job_.reset();
  }
}

void Pool::loop() {
  uint64_t seen = 0;
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return gen_ != seen; });
      seen = gen_;
      job = job_;
    }
    if (!job) continue;
    const int seat = job->seats.fetch_sub(1, std::memory_order_relaxed);
    if (seat > 0) job->work((size_t)seat);
  }
}

bool use_openmp_team() {
  auto lower = [](const char* v) {
    std::string s = v ? v : "";
    for (auto& ch : s) ch = (char)std::tolower((unsigned char)ch);
    return s;
  };
  const std::string mode = lower(std::getenv("MOESPEC_CPU_THREADS"));
  if (mode == "openmp") return true;
  if (mode == "pool") return false;
  TORCH_CHECK(mode.empty() || mode == "auto", "MOESPEC_CPU_THREADS must be openmp, pool or auto; found '", mode, "'");
  return lower(std::getenv("OMP_WAIT_POLICY")) != "passive";
}

void run_job(const std::shared_ptr<Job>& job, int nt) {
  const bool openmp = use_openmp_team();  // read on every call, so a bad setting is refused at one thread too
  if (nt > 1 && openmp) {
#pragma omp parallel num_threads(nt)
    job->work((size_t)omp_get_thread_num());
  } else {
    Pool::get().run(job, nt - 1);
  }
}

}  // namespace moespec
