#pragma once
// Conversions between the native types and Python's, shared by the module's bindings.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <climits>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/util/params.hpp"

namespace kvb::python {

namespace py = pybind11;
using json = nlohmann::json;

// JSON as Python objects (dicts, lists, numbers, strings, None).
py::object to_py(const json& j);
// A parameter value as the registries read it (text): 5 -> "5", True -> "true".
std::string param_text(const py::handle& v);
// A dict of parameters (or None) as the registries take them.
std::map<std::string, std::string> param_map(const py::object& params);
// Parameter declarations as a list of dicts (name, type, default, range or choices, help).
py::list param_list(const std::vector<ParamSpec>& specs);

// A numpy copy of `data`: the engine reuses the buffers a call lends, so a view kept past the call
// would read other numbers, or freed memory.
template <typename T>
py::array copied(const T* data, const std::vector<py::ssize_t>& shape) {
  py::array_t<T> a(shape);
  std::copy_n(data, a.size(), a.mutable_data());
  return a;
}

// An integer argument that refuses Python's bools, which pybind11 reads as 0 and 1 (budget=True would
// run at a KV size of 1, silently).
struct Int {
  int value = 0;
};

// The parts of the module, each adding its functions and classes (module.cpp calls them).
void bind_methods(py::module_& m);
void bind_model(py::module_& m);
void bind_results(py::module_& m);

}  // namespace kvb::python

namespace pybind11::detail {
template <>
struct type_caster<kvb::python::Int> {
  PYBIND11_TYPE_CASTER(kvb::python::Int, const_name("int"));
  // Python and numpy integers only: no bool (numpy's either), and no float, which int() would truncate.
  // A refusal makes pybind11 raise a TypeError naming the signature.
  bool load(handle src, bool) {
    PyObject* o = src.ptr();
    const std::string type = Py_TYPE(o)->tp_name;
    if (PyBool_Check(o) || type == "numpy.bool" || type == "numpy.bool_" || !PyIndex_Check(o)) return false;
    PyObject* i = PyNumber_Index(o);
    if (!i) {
      PyErr_Clear();
      return false;
    }
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (overflow || v < INT_MIN || v > INT_MAX || (v == -1 && PyErr_Occurred())) {
      PyErr_Clear();
      return false;
    }
    value.value = static_cast<int>(v);
    return true;
  }
  static handle cast(kvb::python::Int v, return_value_policy, handle) { return PyLong_FromLong(v.value); }
};
}  // namespace pybind11::detail
