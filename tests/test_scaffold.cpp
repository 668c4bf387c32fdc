// kvbench new method: the documented example under a new name, and what it refuses.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/experiment/scaffold.hpp"
#include "kvbench/doc_templates.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {
std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A stand-in source tree: the component's folder and tests/.
void make_tree(const test::TempDir& root, const char* folder) {
  std::filesystem::create_directories(root / folder);
  std::filesystem::create_directories(root / "tests");
}
}  // namespace

TEST_CASE("scaffold: the documented example renamed, method and class, nothing of the old name left", "[scaffold]") {
  test::TempDir root("scaffold");
  make_tree(root, "methods");
  const ScaffoldFiles f = scaffold(ScaffoldKind::Method, "my_rule2", root.path().string());
  CHECK(f.source == (root / "methods/my_rule2/my_rule2.cpp").string());
  CHECK(f.test == (root / "methods/my_rule2/test_my_rule2.cpp").string());
  const std::string m = slurp(f.source), t = slurp(f.test);
  CHECK(m == scaffold_rename(ScaffoldKind::Method, generated::kMethodTemplate, "my_rule2"));
  CHECK(m.find("// methods/my_rule2/my_rule2.cpp") == 0);
  CHECK(m.find("class MyRule2 final : public ScorerMethod") != std::string::npos);
  CHECK(m.find(".name = \"my_rule2\"") != std::string::npos);
  CHECK(t.find("create(\"my_rule2\"") != std::string::npos);
  CHECK(t.find("\"[my_rule2]\"") != std::string::npos);
  for (const auto& s : {m, t}) {
    CHECK(s.find("keynorm") == std::string::npos);
    CHECK(s.find("KeyNorm") == std::string::npos);
  }
  // A second time the files exist; nothing is overwritten.
  test::require_error([&] { scaffold(ScaffoldKind::Method, "my_rule2", root.path().string()); },
                      {"my_rule2.cpp exists"});
}

TEST_CASE("scaffold: bad names, registered names and a folder that is not the source tree are refused", "[scaffold]") {
  test::TempDir root("scaffold_bad");
  for (const char* bad : {"", "2fast", "My", "a-b", "a b", "x/y"})
    test::require_error([&] { scaffold(ScaffoldKind::Method, bad, root.path().string()); }, {"is not a method name"});
  test::require_error([&] { scaffold(ScaffoldKind::Method, "snapkv", root.path().string()); }, {"already registered"});
  test::require_error([&] { scaffold(ScaffoldKind::Method, "keynorm", root.path().string()); }, {"documented example"});
  // Found by an audit: the other example's name, and names whose class is a type the code uses, did not build.
  test::require_error([&] { scaffold(ScaffoldKind::Method, "snapkv_int8", root.path().string()); },
                      {"documented example"});
  test::require_error([&] { scaffold(ScaffoldKind::Method, "prefill_view", root.path().string()); },
                      {"class PrefillView", "uses already"});
  test::require_error([&] { scaffold(ScaffoldKind::Task, "sample", root.path().string()); },
                      {"class Sample", "uses already"});
  test::require_error([&] { scaffold(ScaffoldKind::Method, "fresh", root.path().string()); },
                      {"no methods/ and tests/"});
  CHECK(std::filesystem::is_empty(root.path()));
}

TEST_CASE("scaffold: a task from the documented passkey example, in its own folder", "[scaffold]") {
  test::TempDir root("scaffold_task");
  make_tree(root, "tasks");
  const ScaffoldFiles f = scaffold(ScaffoldKind::Task, "digits", root.path().string());
  CHECK(f.source == (root / "tasks/digits/digits.cpp").string());
  CHECK(f.test == (root / "tests/test_digits.cpp").string());
  const std::string src = slurp(f.source), t = slurp(f.test);
  CHECK(src == scaffold_rename(ScaffoldKind::Task, generated::kTaskTemplate, "digits"));
  CHECK(src.find("class Digits final : public Task") != std::string::npos);
  CHECK(t.find("create(\"digits\"") != std::string::npos);
  CHECK(src.find("passkey") == std::string::npos);
  CHECK(src.find("Passkey") == std::string::npos);
  test::require_error([&] { scaffold(ScaffoldKind::Task, "niah", root.path().string()); }, {"already registered"});
  test::require_error([&] { scaffold(ScaffoldKind::Task, "passkey", root.path().string()); }, {"documented example"});
}
