// Stage clock (stage_clock.h): the switch and each thread's last record.
#include "stage_clock.h"

namespace moespec {

std::atomic<bool> g_stage_clock{false};
thread_local StageTimes g_last_stages;

void set_stage_clock(bool on) { g_stage_clock.store(on, std::memory_order_relaxed); }
std::vector<int64_t> take_last_stages() {
  const StageTimes st = g_last_stages;
  g_last_stages = StageTimes{};
  return {st.entry, st.setup_done, st.first_item, st.work_done, st.exit};
}

}  // namespace moespec
