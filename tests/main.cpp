#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "kernels/cpu/blas_core.hpp"

// The tests run on the OpenBLAS kernels kvbench itself runs on (kernels/cpu/blas_core.hpp).
int main(int argc, char** argv) {
  kvb::use_processor_blas_kernels(argv);
  return Catch::Session().run(argc, argv);
}
