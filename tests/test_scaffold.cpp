// kvbench new method: the documented example under a new name, and what it refuses.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/method/scaffold.hpp"
#include "kvbench/method_template.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {
std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("scaffold: the documented example renamed, method and class, nothing of the old name left", "[scaffold]") {
  test::TempDir root("scaffold");
  std::filesystem::create_directories(root / "methods");
  std::filesystem::create_directories(root / "tests");
  const ScaffoldFiles f = scaffold_method("my_rule2", root.path().string());
  CHECK(f.method == (root / "methods/my_rule2.cpp").string());
  const std::string m = slurp(f.method), t = slurp(f.test);
  CHECK(m == scaffold_rename(generated::kMethodTemplate, "my_rule2"));
  CHECK(m.find("// methods/my_rule2.cpp") == 0);
  CHECK(m.find("class MyRule2 final : public Method") != std::string::npos);
  CHECK(m.find(".name = \"my_rule2\"") != std::string::npos);
  CHECK(t.find("create(\"my_rule2\"") != std::string::npos);
  CHECK(t.find("\"[my_rule2]\"") != std::string::npos);
  for (const auto& s : {m, t}) {
    CHECK(s.find("keynorm") == std::string::npos);
    CHECK(s.find("KeyNorm") == std::string::npos);
  }
  // A second time the files exist; nothing is overwritten.
  test::require_error([&] { scaffold_method("my_rule2", root.path().string()); }, {"my_rule2.cpp exists"});
}

TEST_CASE("scaffold: bad names, registered names and a folder that is not the source tree are refused", "[scaffold]") {
  test::TempDir root("scaffold_bad");
  for (const char* bad : {"", "2fast", "My", "a-b", "a b", "x/y"})
    test::require_error([&] { scaffold_method(bad, root.path().string()); }, {"is not a method name"});
  test::require_error([&] { scaffold_method("snapkv", root.path().string()); }, {"already registered"});
  test::require_error([&] { scaffold_method("keynorm", root.path().string()); }, {"documented example"});
  test::require_error([&] { scaffold_method("fresh", root.path().string()); }, {"no methods/ and tests/"});
  CHECK(std::filesystem::is_empty(root.path()));
}
