#pragma once
// OpenBLAS picks its kernels for the processor when it loads. The release Debian 12 ships (0.3.21)
// does not know processors newer than it (Emerald Rapids, for one) and falls back to its SSE3 kernels
// ("Prescott"), whose sgemm runs prefill's products at a fifth of the rate of the kernels it has for
// the processor's instruction set. kvbench then asks for those kernels instead, through
// OPENBLAS_CORETYPE, which OpenBLAS reads only when it loads: hence a re-exec.
#include <string_view>

namespace kvb {

// The core type to ask OpenBLAS for, or nullptr to keep its choice: `detected` is what OpenBLAS chose,
// `told` whether OPENBLAS_CORETYPE was set (a choice of the user's, kept), `avx512` and `avx2` what
// the processor runs (AVX-512 F/BW/DQ/VL/CD; AVX2 with FMA).
const char* blas_core_choice(std::string_view detected, bool told, bool avx512, bool avx2);

// blas_core_choice for this process: OpenBLAS's choice, the environment and the processor.
const char* blas_core_for_processor();

// The core type OpenBLAS runs in this process ("SkylakeX", "Haswell", ...), as OPENBLAS_CORETYPE names it.
const char* blas_core_in_use();

// Where blas_core_for_processor names a core, sets OPENBLAS_CORETYPE and executes this program again
// with the same arguments; returns only if it keeps the kernels (or the re-exec failed, which leaves
// the run on OpenBLAS's fallback: slower, with records that name it).
void use_processor_blas_kernels(char** argv);

}  // namespace kvb
