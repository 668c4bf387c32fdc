#include "harness/util/params.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/util/error.hpp"

namespace kvb {

ParamSpec ParamSpec::integer(std::string name, long def, long min, long max, std::string help) {
  return {std::move(name),          Type::Int, std::to_string(def), static_cast<double>(min),
          static_cast<double>(max), {},        std::move(help)};
}
ParamSpec ParamSpec::real(std::string name, double def, double min, double max, std::string help) {
  return {std::move(name), Type::Float, fmt::format("{}", def), min, max, {}, std::move(help)};
}
ParamSpec ParamSpec::boolean(std::string name, bool def, std::string help) {
  return {std::move(name), Type::Bool, def ? "true" : "false", 0, 0, {}, std::move(help)};
}
ParamSpec ParamSpec::choice(std::string name, std::string def, std::vector<std::string> choices, std::string help) {
  return {std::move(name), Type::Choice, std::move(def), 0, 0, std::move(choices), std::move(help)};
}

ParamSpec ParamSpec::text(std::string name, std::string def, std::string help) {
  return {std::move(name), Type::Text, std::move(def), 0, 0, {}, std::move(help)};
}

std::string ParamSpec::describe() const {
  switch (type) {
    case Type::Int:
      return fmt::format("int in [{}, {}], default {}", static_cast<long>(min), static_cast<long>(max), default_value);
    case Type::Float:
      return fmt::format("float in [{}, {}], default {}", min, max, default_value);
    case Type::Bool:
      return fmt::format("bool, default {}", default_value);
    case Type::Choice:
      return fmt::format("one of {}, default {}", fmt::join(choices, "|"), default_value);
    case Type::Text:
      return default_value.empty() ? "text" : fmt::format("text, default {}", default_value);
  }
  return "";
}

namespace {

// Canonical text of a value, or an empty string if it does not parse.
std::string normalise(const ParamSpec& s, const std::string& v) {
  try {
    size_t used = 0;
    switch (s.type) {
      case ParamSpec::Type::Int: {
        const long x = std::stol(v, &used);
        if (used != v.size() || x < static_cast<long>(s.min) || x > static_cast<long>(s.max)) return "";
        return std::to_string(x);
      }
      case ParamSpec::Type::Float: {
        const double x = std::stod(v, &used);
        if (used != v.size() || !std::isfinite(x) || x < s.min || x > s.max) return "";
        return fmt::format("{}", x);
      }
      case ParamSpec::Type::Bool:
        if (v == "true" || v == "1" || v == "yes") return "true";
        if (v == "false" || v == "0" || v == "no") return "false";
        return "";
      case ParamSpec::Type::Choice:
        return std::find(s.choices.begin(), s.choices.end(), v) != s.choices.end() ? v : "";
      case ParamSpec::Type::Text:
        return v;
    }
  } catch (const std::exception&) {
  }
  return "";
}

}  // namespace

Params::Params(const std::vector<ParamSpec>& specs, const std::map<std::string, std::string>& given,
               const std::string& owner)
    : owner_(owner) {
  for (const auto& [k, v] : given) {
    auto it = std::find_if(specs.begin(), specs.end(), [&k = k](const ParamSpec& s) { return s.name == k; });
    if (it == specs.end()) {
      std::string valid;
      for (const auto& s : specs) valid += fmt::format("\n  {} ({})", s.name, s.describe());
      fail("{}: unknown parameter '{}'; valid parameters:{}", owner, k, valid);
    }
    const std::string n = normalise(*it, v);
    if (n.empty()) fail("{}: parameter '{}' = '{}' is invalid: expected {}", owner, k, v, it->describe());
    values_[k] = n;
  }
  for (const auto& s : specs) {
    if (!values_.count(s.name)) values_[s.name] = s.default_value;
    if (!s.keyed_at_default) unkeyed_[s.name] = s.earlier.empty() ? s.default_value : s.earlier;
  }
}

std::map<std::string, std::string> Params::keyed_values() const {
  auto v = values_;
  for (const auto& [name, earlier] : unkeyed_)
    if (v.at(name) == earlier) v.erase(name);
  return v;
}

ParamSpec ParamSpec::added_later() const {
  ParamSpec s = *this;
  s.keyed_at_default = false;
  return s;
}

ParamSpec ParamSpec::added_later(std::string earlier_value) const {
  ParamSpec s = added_later();
  s.earlier = std::move(earlier_value);
  return s;
}

const std::string& Params::get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) fail("{}: internal: parameter '{}' was not declared", owner_, name);
  return it->second;
}
long Params::get_int(const std::string& name) const { return std::stol(get(name)); }
int Params::integer(const std::string& name) const {
  const long v = get_int(name);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
    fail("{}: parameter '{}' = {} does not fit an int", owner_, name, v);
  return static_cast<int>(v);
}
double Params::get_float(const std::string& name) const { return std::stod(get(name)); }
bool Params::get_bool(const std::string& name) const { return get(name) == "true"; }

std::map<std::string, std::string> params_from_yaml(const YAML::Node& node, const std::string& where) {
  std::map<std::string, std::string> out;
  if (!node || node.IsNull()) return out;
  auto at = [&](const YAML::Node& n) { return fmt::format("{}:{}:{}", where, n.Mark().line + 1, n.Mark().column + 1); };
  if (!node.IsMap()) fail("{}: method parameters must be a mapping of name: value", at(node));
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    if (!kv.second.IsScalar())
      fail("{}: parameter '{}' must be a single value, not a list or mapping", at(kv.second), key);
    if (!out.emplace(key, kv.second.as<std::string>()).second)
      fail("{}: parameter '{}' given twice", at(kv.first), key);
  }
  return out;
}

NamedParams parse_named_params(const std::string& spec, const std::string& option) {
  const size_t colon = spec.find(':');
  NamedParams out{spec.substr(0, colon), {}};
  if (colon == std::string::npos) return out;
  for (size_t b = colon + 1; b <= spec.size();) {
    const size_t e = std::min(spec.find(',', b), spec.size());
    const std::string kv = spec.substr(b, e - b);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) fail("{} {}: '{}' is not key=value", option, spec, kv);
    const std::string key = kv.substr(0, eq);
    for (const auto& given : out.params)
      if (given.first == key) fail("{} {}: parameter '{}' given twice", option, spec, key);
    out.params.emplace_back(key, kv.substr(eq + 1));
    b = e + 1;
  }
  return out;
}

}  // namespace kvb
