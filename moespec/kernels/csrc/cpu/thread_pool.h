// Work items dealt into lanes, one per thread, and the threads that run them: torch's OpenMP team
// or a pool of persistent helpers of our own (docs/kernels.md, "Threads").
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace moespec {

// The work of one call. Items come in lanes, one per thread: each thread takes its own lane's items
// in order (a lane is a contiguous share of the rows of every matrix, so each thread streams long
// contiguous runs, as a parallel torch.sum does), and when its lane is empty, or its next item must
// wait, it takes the next item of another lane. An item may depend on a flag (a phase-3 item on its
// group's h); it is claimed only once the flag is set.
struct Job {
  std::vector<std::vector<int64_t>> lanes;       // item ids per lane, in order
  std::unique_ptr<std::atomic<int64_t>[]> next;  // next position per lane
  std::vector<int64_t> dep;                      // per item id: the flag it waits for, or -1
  std::unique_ptr<std::atomic<int>[]> flags;     // set by items (through Job::set)
  std::atomic<int64_t> done{0};
  std::atomic<int> seats{0};
  int64_t items = 0;
  std::function<void(int64_t)> item;

  Job(std::vector<std::vector<int64_t>> lanes_, std::vector<int64_t> dep_, int64_t nflags);
  void set(int64_t flag) { flags[flag].store(1, std::memory_order_release); }
  // Claim one item, own lane first; -1 when every lane is empty, -2 when the items left must wait.
  int64_t claim(size_t home);
  // Run items (own lane home first) until every lane is empty.
  void work(size_t home);
};

// Persistent helper threads. An OpenMP parallel region ends in a join that waits for every thread
// of the team, also one that the OS has not yet scheduled: on a shared, oversubscribed CPU that
// costs a whole time slice (docs/kernels.md, "Threads"). Here the calling thread works through the
// items itself and returns as soon as every item is done; a helper that wakes up late finds no item
// left and touches nothing of the finished call (everything it reads before claiming an item lives
// in the Job, which it holds through a shared_ptr).
class Pool {
 public:
  static Pool& get();
  // Run every item of job with the caller (lane 0) plus up to helpers other threads (lanes 1..).
  void run(const std::shared_ptr<Job>& job, int helpers);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Job> job_;
  uint64_t gen_ = 0;
  size_t threads_ = 0;
};

// Which threads help the caller. torch's OpenMP workers (the same libgomp) keep spinning for a
// while after each parallel torch op unless OMP_WAIT_POLICY=passive; a helper of our own pool then
// shares a core with a spinning worker, while an OpenMP team reuses that awake worker at once. On
// an oversubscribed machine the team's closing join can wait for a descheduled member (see Pool),
// which our pool never does. MOESPEC_CPU_THREADS=openmp|pool chooses; the default (auto) takes the
// OpenMP team unless OMP_WAIT_POLICY is passive.
bool use_openmp_team();

// Run every item of job on nt threads: torch's OpenMP team or the caller plus nt - 1 pool helpers
// (use_openmp_team); the caller alone when nt == 1.
void run_job(const std::shared_ptr<Job>& job, int nt);

}  // namespace moespec
