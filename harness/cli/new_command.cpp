// kvbench new method NAME: starts a method from the worked example of docs/adding-a-method.md.
#include <fmt/format.h>

#include "harness/cli/commands.hpp"
#include "harness/method/scaffold.hpp"

namespace kvb::cli {

void register_new_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("new", "Start a new component from the documented example");
  cmd->require_subcommand(1);
  auto* method = cmd->add_subcommand("method", "Write methods/NAME.cpp and tests/test_NAME.cpp (docs/adding-a-method.md)");
  struct Args {
    std::string name, root = ".";
  };
  auto a = std::make_shared<Args>();
  method->add_option("name", a->name, "Method name: lower case letters, digits, underscores")->required();
  method->add_option("--root", a->root, "The kvbench source tree (default: the current directory)");
  method->callback([a] {
    const ScaffoldFiles f = scaffold_method(a->name, a->root);
    fmt::print("wrote {} and {}: the key-norm example of docs/adding-a-method.md as method '{}'. Replace its score,\n"
               "summary and comments and the rule its test checks, then build (cmake --build build) and run\n"
               "./build/tests/kvbench_tests \"[{}]\".\n",
               f.method, f.test, a->name, a->name);
  });
}

}  // namespace kvb::cli
