// The Python module kvbench._kvbench: the native engine, registries, sweeps and metrics for Python
// (python/kvbench/__init__.py wraps it). Arrays the engine owns are handed out as read-only numpy
// views without copies; methods written in Python (kvbench.Method) join the native method registry.
#include <fmt/format.h>

#include "harness/util/error.hpp"
#include "kernels/cpu/blas_core.hpp"
#include "python/src/convert.hpp"

PYBIND11_MODULE(_kvbench, m) {
  using namespace kvb;
  using namespace kvb::python;
  m.doc() = "kvbench's native engine, registries, sweeps and metrics";
  const std::string pybind11_version =
      fmt::format("{}.{}.{}", PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR, PYBIND11_VERSION_PATCH);
  m.attr("pybind11_version") = pybind11_version;
#if PYBIND11_VERSION_MAJOR < 2 || (PYBIND11_VERSION_MAJOR == 2 && PYBIND11_VERSION_MINOR < 12)
  // pybind11 before 2.12 reads numpy 1's descriptor layout: under numpy 2 every array it makes has
  // zero strides, each element reading as the first. Refuse rather than hand those out.
  {
    const std::string np = py::module_::import("numpy").attr("__version__").cast<std::string>();
    if (!np.starts_with("1."))
      throw py::import_error(fmt::format(
          "kvbench: this module was built with pybind11 {}, which predates numpy 2, and numpy {} is installed: its "
          "arrays would read wrong. Rebuild it with pybind11 >= 2.12 (scripts/setup.sh fetches 2.13.6; pip install . "
          "uses the package index's) or use numpy < 2",
          pybind11_version, np));
  }
#endif
  // The command line re-executes itself onto these kernels (kernels/cpu/blas_core.hpp); an interpreter
  // cannot, and OpenBLAS has loaded by now.
  if (const char* core = blas_core_for_processor())
    if (PyErr_WarnEx(
            PyExc_RuntimeWarning,
            fmt::format("kvbench: OpenBLAS did not recognise this processor and runs its SSE3 (Prescott) kernels, "
                        "several times slower in prefill; set OPENBLAS_CORETYPE={} before starting Python",
                        core)
                .c_str(),
            1) < 0)
      throw py::error_already_set();  // warnings made errors
  m.def(
      "blas_kernels", [] { return std::string(blas_core_in_use()); },
      "The kernels OpenBLAS runs in this process, as OPENBLAS_CORETYPE names them");
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);

  bind_methods(m);
  bind_results(m);
  bind_model(m);
}
