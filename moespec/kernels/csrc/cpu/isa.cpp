// The ISA path of each format (CPU flags, capped by MOESPEC_CPU_ISA) and its dot kernel.
#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

#include "dot.h"

namespace moespec {

static int isa_cap() {
  const char* env = std::getenv("MOESPEC_CPU_ISA");
  if (!env || !*env) return AVX512;
  std::string v(env);
  if (v == "portable") return PORTABLE;
  if (v == "avx2") return AVX2;
  if (v == "avx512") return AVX512;
  TORCH_CHECK(false, "MOESPEC_CPU_ISA must be avx512, avx2 or portable; found '", v, "'");
  return AVX512;
}

// Whether MOESPEC_CPU_ISA leaves the AVX-512 level allowed (read_probe.cpp's loops follow the cap).
bool isa_cap_allows_avx512() { return isa_cap() >= AVX512; }

// The ISA path used for a format on this CPU (highest the CPU has and the cap allows).
int isa_for(int fmt) {
  __builtin_cpu_init();
  int cap = isa_cap();
  bool a512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (fmt == BF16) a512 = a512 && __builtin_cpu_supports("avx512bf16");
  if (fmt == I8) a512 = a512 && __builtin_cpu_supports("avx512vnni");
  bool a2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (cap >= AVX512 && a512) return AVX512;
  if (cap >= AVX2 && a2) return AVX2;
  return PORTABLE;
}

DotFn dot_for(int fmt, int isa) {
  static const DotFn table[3][3] = {
      {dot_f32_portable_fn, dot_f32_avx2_fn, dot_f32_avx512_fn},
      {dot_bf16_portable_fn, dot_bf16_avx2_fn, dot_bf16_avx512_fn},
      {dot_i8_portable_fn, dot_i8_avx2_fn, dot_i8_avx512_fn}};
  return table[fmt][isa];
}

// A format's code from its name ("f32", "bf16", "int8_b32"); who names the caller in the error.
int format_code(const std::string& fmt, const char* who) {
  const int f = fmt == "f32" ? F32 : (fmt == "bf16" ? BF16 : (fmt == "int8_b32" ? I8 : -1));
  TORCH_CHECK(f >= 0, who, ": format must be f32, bf16 or int8_b32; found '", fmt, "'");
  return f;
}

// Which ISA path the CPU kernels take for a format ("f32", "bf16", "int8_b32") here and now.
std::string cpu_isa(const std::string& fmt) {
  const int f = format_code(fmt, "cpu_isa");
  static const char* names[] = {"portable", "avx2", "avx512"};
  return names[isa_for(f)];
}

}  // namespace moespec
