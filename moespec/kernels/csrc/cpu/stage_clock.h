// Stage clock: where the time of one call goes (docs/kernels.md, "Where a call's time goes";
// moespec.kernels.call_stages). Off unless switched on; then the driver records steady_clock
// times (CLOCK_MONOTONIC on Linux, the clock of Python's time.monotonic_ns) at its stage
// boundaries into the calling thread's last record. Off, it costs one relaxed load per call.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

namespace moespec {

struct StageTimes {
  int64_t entry = 0;       // the driver's first line
  int64_t setup_done = 0;  // inputs checked, groups, work items and activations ready
  int64_t first_item = 0;  // the first work item starts (on any thread)
  int64_t work_done = 0;   // every work item done
  int64_t exit = 0;        // the output combined (step 4), returning
};
extern std::atomic<bool> g_stage_clock;
extern thread_local StageTimes g_last_stages;
static inline int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void set_stage_clock(bool on);
// The calling thread's last record as [entry, setup_done, first_item, work_done, exit] (ns), then
// cleared: zeros when no call completed with the clock on since the last read.
std::vector<int64_t> take_last_stages();

}  // namespace moespec
