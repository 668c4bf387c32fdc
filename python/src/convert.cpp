#include "python/src/convert.hpp"

#include <pybind11/stl.h>

#include <cmath>

namespace kvb::python {

py::object to_py(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return py::none();
    case json::value_t::boolean:
      return py::bool_(j.get<bool>());
    case json::value_t::number_integer:
      return py::int_(j.get<int64_t>());
    case json::value_t::number_unsigned:
      return py::int_(j.get<uint64_t>());
    case json::value_t::number_float:
      return py::float_(j.get<double>());
    case json::value_t::string:
      return py::str(j.get_ref<const std::string&>());
    case json::value_t::array: {
      py::list l;
      for (const auto& x : j) l.append(to_py(x));
      return l;
    }
    case json::value_t::object: {
      py::dict d;
      for (const auto& [k, v] : j.items()) d[py::str(k)] = to_py(v);
      return d;
    }
    default:
      return py::none();
  }
}

std::string param_text(const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  return py::str(v).cast<std::string>();
}

std::map<std::string, std::string> param_map(const py::object& params) {
  std::map<std::string, std::string> out;
  if (params.is_none()) return out;
  for (const auto& [k, v] : params.cast<py::dict>()) out[py::str(k).cast<std::string>()] = param_text(v);
  return out;
}

py::list param_list(const std::vector<ParamSpec>& specs) {
  static const char* types[] = {"int", "float", "bool", "choice", "text"};
  py::list l;
  for (const auto& p : specs) {
    py::dict d;
    d["name"] = p.name;
    d["type"] = types[static_cast<int>(p.type)];
    // Typed as the parameter, as a method's self.params holds it; "" (no default) is None.
    const std::string& v = p.default_value;
    if (v.empty() && p.type != ParamSpec::Type::Text && p.type != ParamSpec::Type::Choice)
      d["default"] = py::none();
    else if (p.type == ParamSpec::Type::Int)
      d["default"] = std::stoll(v);
    else if (p.type == ParamSpec::Type::Float)
      d["default"] = std::stod(v);
    else if (p.type == ParamSpec::Type::Bool)
      d["default"] = v == "true";
    else
      d["default"] = v;
    if (p.type == ParamSpec::Type::Int) d["range"] = py::make_tuple(std::llround(p.min), std::llround(p.max));
    if (p.type == ParamSpec::Type::Float) d["range"] = py::make_tuple(p.min, p.max);
    if (p.type == ParamSpec::Type::Choice) d["choices"] = p.choices;
    d["help"] = p.help;
    l.append(d);
  }
  return l;
}

}  // namespace kvb::python
