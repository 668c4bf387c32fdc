#include "kernels/cpu/blas_core.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>

namespace kvb {

const char* blas_core_choice(std::string_view detected, bool told, bool avx512, bool avx2) {
  // Only OpenBLAS's fallback for processors it does not recognise is overridden: any other choice is
  // its own judgement of the processor (Zen's kernels on Zen, say), and the user's setting stands.
  if (told || detected != "Prescott") return nullptr;
  if (avx512) return "SkylakeX";
  if (avx2) return "Haswell";
  return nullptr;
}

const char* blas_core_for_processor() {
  __builtin_cpu_init();
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512cd");
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return blas_core_choice(openblas_get_corename(), std::getenv("OPENBLAS_CORETYPE") != nullptr, avx512, avx2);
}

const char* blas_core_in_use() { return openblas_get_corename(); }

void use_processor_blas_kernels(char** argv) {
  const char* core = blas_core_for_processor();
  if (core == nullptr) return;
  // The variable also keeps the new process from coming back here.
  if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
  execv("/proc/self/exe", argv);
}

}  // namespace kvb
