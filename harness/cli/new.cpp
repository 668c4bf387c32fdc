// kvbench new method|task NAME: starts a component from the worked example of its docs/ page.
#include <fmt/format.h>

#include "harness/cli/commands.hpp"
#include "harness/experiment/scaffold.hpp"

namespace kvb::cli {

void register_new_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("new", "Start a new method or task from the documented example");
  cmd->require_subcommand(1);
  struct Kind {
    const char* word;
    ScaffoldKind kind;
    const char* help;
    const char* example;
    const char* doc;
  };
  for (const Kind k :
       {Kind{"method", ScaffoldKind::Method, "Write methods/NAME/NAME.cpp and methods/NAME/test_NAME.cpp", "key-norm",
             "docs/adding-a-method.md"},
        Kind{"task", ScaffoldKind::Task, "Write tasks/NAME/NAME.cpp and tests/test_NAME.cpp", "passkey",
             "docs/adding-a-task.md"}}) {
    auto* sub = cmd->add_subcommand(k.word, fmt::format("{} (from {})", k.help, k.doc));
    auto name = std::make_shared<std::string>();
    auto root = std::make_shared<std::string>(".");
    sub->add_option("name", *name, "Name: lower case letters, digits, underscores")->required();
    sub->add_option("--root", *root, "The kvbench source tree (default: the current directory)");
    sub->callback([k, name, root] {
      const ScaffoldFiles f = scaffold(k.kind, *name, *root);
      fmt::print(
          "wrote {} and {}: the {} example of {} as {} '{}'. Replace what makes it the example\n"
          "(its rule, summary and comments) and what its test checks, then build (cmake --build build) and\n"
          "run ./build/tests/kvbench_tests \"[{}]\".\n",
          f.source, f.test, k.example, k.doc, k.word, *name, *name);
    });
  }
}

}  // namespace kvb::cli
