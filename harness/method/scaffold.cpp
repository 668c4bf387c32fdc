#include "harness/method/scaffold.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include "harness/method/method.hpp"
#include "harness/util/error.hpp"
#include "kvbench/method_template.hpp"

namespace kvb {
namespace {

constexpr const char* kExampleName = "keynorm";
constexpr const char* kExampleClass = "KeyNorm";

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
}

}  // namespace

std::string scaffold_rename(const std::string& text, const std::string& name) {
  std::string camel;
  bool up = true;
  for (char c : name) {
    if (c == '_') {
      up = true;
      continue;
    }
    camel += up ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    up = false;
  }
  std::string out = text;
  replace_all(out, kExampleClass, camel);
  replace_all(out, kExampleName, name);
  return out;
}

ScaffoldFiles scaffold_method(const std::string& name, const std::string& root) {
  namespace fs = std::filesystem;
  const bool valid = !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
                     std::all_of(name.begin(), name.end(), [](char c) {
                       return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
                              c == '_';
                     });
  if (!valid)
    fail("kvbench new method: '{}' is not a method name: lower case letters, digits and underscores, starting with a "
         "letter",
         name);
  // The example itself is compiled into the tests under its own name.
  if (name == kExampleName)
    fail("kvbench new method: '{}' is the documented example's own name; choose another", name);
  const auto names = MethodRegistry::get().names();
  if (std::find(names.begin(), names.end(), name) != names.end())
    fail("kvbench new method: a method named '{}' is already registered (kvbench list methods)", name);
  const fs::path methods = fs::path(root) / "methods", tests = fs::path(root) / "tests";
  if (!fs::is_directory(methods) || !fs::is_directory(tests))
    fail("kvbench new method: {} has no methods/ and tests/ folders; run it in the kvbench source tree or give --root",
         root);
  ScaffoldFiles f{(methods / (name + ".cpp")).string(), (tests / ("test_" + name + ".cpp")).string()};
  for (const auto& p : {f.method, f.test})
    if (fs::exists(p)) fail("kvbench new method: {} exists; remove it or choose another name", p);
  for (const auto& [path, text] : {std::pair{f.method, generated::kMethodTemplate}, {f.test, generated::kMethodTestTemplate}}) {
    std::ofstream out(path, std::ios::binary);
    out << scaffold_rename(text, name);
    if (!out) fail("kvbench new method: cannot write {}", path);
  }
  return f;
}

}  // namespace kvb
