#include "harness/experiment/scaffold.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>

#include "harness/method/method.hpp"
#include "harness/task/task.hpp"
#include "harness/util/error.hpp"
#include "kvbench/doc_templates.hpp"

namespace kvb {
namespace {

struct Example {
  const char* kind;        // "method", "task"
  const char* name;        // the example's registered name
  const char* class_name;  // its class
  const char* folder;      // where such files live
  const char* source;      // its template
  const char* test;
};

Example example(ScaffoldKind k) {
  if (k == ScaffoldKind::Method)
    return {"method", "keynorm", "KeyNorm", "methods", generated::kMethodTemplate, generated::kMethodTestTemplate};
  return {"task", "passkey", "Passkey", "tasks", generated::kTaskTemplate, generated::kTaskTestTemplate};
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

}  // namespace

std::string scaffold_rename(ScaffoldKind kind, const std::string& text, const std::string& name) {
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
  const Example e = example(kind);
  std::string out = text;
  replace_all(out, e.class_name, camel);
  replace_all(out, e.name, name);
  return out;
}

ScaffoldFiles scaffold(ScaffoldKind kind, const std::string& name, const std::string& root) {
  namespace fs = std::filesystem;
  const Example e = example(kind);
  const std::string cmd = fmt::format("kvbench new {}", e.kind);
  const bool valid =
      !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_';
      });
  if (!valid)
    fail("{}: '{}' is not a {} name: lower case letters, digits and underscores, starting with a letter", cmd, name,
         e.kind);
  // The documented examples are compiled into the tests under their own names.
  if (std::string(generated::kDocExampleNames).find(" " + name + " ") != std::string::npos)
    fail("{}: '{}' is a documented example's own name; choose another", cmd, name);
  // The class takes the name in CamelCase: it must not be a type the example's code already uses.
  const std::string renamed = scaffold_rename(kind, e.class_name, name);
  const std::regex word("\\b" + renamed + "\\b");
  if (renamed != e.class_name && (std::regex_search(e.source, word) || std::regex_search(e.test, word)))
    fail("{}: '{}' would name its class {}, which the {}'s code uses already (kvbench's own type); choose another", cmd,
         name, renamed, e.kind);
  const auto names = kind == ScaffoldKind::Method ? MethodRegistry::get().names() : TaskRegistry::get().names();
  if (std::find(names.begin(), names.end(), name) != names.end())
    fail("{}: a {} named '{}' is already registered (kvbench list {}s)", cmd, e.kind, name, e.kind);
  const fs::path folder = fs::path(root) / e.folder, tests = fs::path(root) / "tests";
  if (!fs::is_directory(folder) || !fs::is_directory(tests))
    fail("{}: {} has no {}/ and tests/ folders; run it in the kvbench source tree or give --root", cmd, root, e.folder);
  // A method's folder holds its test too; a task's test joins the other task tests.
  const fs::path source = folder / name / (name + ".cpp");
  const fs::path test = (kind == ScaffoldKind::Method ? folder / name : tests) / ("test_" + name + ".cpp");
  ScaffoldFiles f{source.string(), test.string()};
  for (const auto& p : {f.source, f.test})
    if (fs::exists(p)) fail("{}: {} exists; remove it or choose another name", cmd, p);
  fs::create_directories(source.parent_path());
  for (const auto& [path, text] : {std::pair{f.source, e.source}, {f.test, e.test}}) {
    std::ofstream out(path, std::ios::binary);
    out << scaffold_rename(kind, text, name);
    if (!out) fail("{}: cannot write {}", cmd, path);
  }
  return f;
}

}  // namespace kvb
