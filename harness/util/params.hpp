#pragma once
// Typed method parameters: each method declares its parameters (type, default, range or choices);
// values given on the command line or in YAML are checked against that list. An unknown key or a bad
// value is an error that lists what is valid.
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace YAML {
class Node;
}

namespace kvb {

struct ParamSpec {
  enum class Type { Int, Float, Bool, Choice, Text };
  std::string name;
  Type type = Type::Int;
  std::string default_value;
  double min = 0, max = 0;           // Int/Float: inclusive range
  std::vector<std::string> choices;  // Choice
  std::string help;
  // False for a parameter added after results were recorded: at the value that gives the earlier
  // behaviour (`earlier`, its default unless given) it stays out of result keys (Params::keyed_values),
  // so those results still count.
  bool keyed_at_default = true;
  std::string earlier = {};

  static ParamSpec integer(std::string name, long def, long min, long max, std::string help);
  static ParamSpec real(std::string name, double def, double min, double max, std::string help);
  static ParamSpec boolean(std::string name, bool def, std::string help);
  static ParamSpec choice(std::string name, std::string def, std::vector<std::string> choices, std::string help);
  // Any non-empty text (e.g. a directory); the default may be empty.
  static ParamSpec text(std::string name, std::string def, std::string help);
  std::string describe() const;  // "int in [1, 512], default 8"
  // The same parameter marked as added later (keyed_at_default = false): its default is the earlier
  // behaviour, or `earlier_value` is (a new default that changes what the method computes).
  ParamSpec added_later() const;
  ParamSpec added_later(std::string earlier_value) const;
};

class Params {
 public:
  Params() = default;
  // Validates `given` against `specs` and fills defaults; `owner` names the method in errors.
  Params(const std::vector<ParamSpec>& specs, const std::map<std::string, std::string>& given,
         const std::string& owner);

  long get_int(const std::string& name) const;
  // An integer parameter as an int (window sizes, counts); an error naming it if it does not fit.
  int integer(const std::string& name) const;
  double get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get(const std::string& name) const;
  const std::map<std::string, std::string>& values() const { return values_; }
  // What a result's key holds: the values without the added-later parameters at their earlier behaviour.
  std::map<std::string, std::string> keyed_values() const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, std::string> unkeyed_;  // added-later parameters: name -> the earlier behaviour's value
  std::string owner_;
};

// A method named with its parameters in one command-line value, "NAME" or "NAME:key=value,..." (kvbench
// bench --method, kvbench report --baseline); a piece that is not key=value is an error naming `option`.
struct NamedParams {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;  // in the order written
};
NamedParams parse_named_params(const std::string& spec, const std::string& option);

// The scalar values of a YAML mapping as text, ready for Params; anything but a mapping of scalars is
// an error naming `where` (the file) with the line and column.
std::map<std::string, std::string> params_from_yaml(const YAML::Node& node, const std::string& where);

}  // namespace kvb
