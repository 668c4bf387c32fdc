// kvbench list: the registered methods (their parameters and offline steps), tasks and backends.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/cli/commands.hpp"
#include "harness/engine/backend.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/unicode.hpp"

namespace kvb::cli {

void register_list_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("list", "List registered components");
  auto what = std::make_shared<std::string>();
  cmd->add_option("what", *what, "methods or tasks")->required()->check(CLI::IsMember({"methods", "tasks"}));
  cmd->callback([what] {
    if (*what == "tasks") {
      const auto& reg = TaskRegistry::get();
      for (const auto& name : reg.names()) {
        const TaskInfo& t = reg.info(name);
        fmt::print("{:14} {}\n", name, t.summary);
        for (const auto& p : t.options) fmt::print("    {:10} {}  {}\n", p.name, p.describe(), p.help);
      }
      return;
    }
    const auto& reg = MethodRegistry::get();
    for (const auto& name : reg.names()) {
      const MethodInfo& info = reg.info(name);
      fmt::print("{:14} {}\n", name, info.summary);
      for (const auto& p : reg.param_specs(name)) fmt::print("    {:10} {}  {}\n", p.name, p.describe(), p.help);
      if (info.composition == Composition::Wrapper)
        fmt::print(
            "    base.NAME  any parameter of the base method (or base_params: in YAML); the base's gqa is this "
            "method's\n    wraps: {}\n",
            fmt::join(reg.names(Composition::Selector), ", "));
      if (info.composition == Composition::Selector)
        fmt::print("    can be wrapped by: {}\n", fmt::join(reg.names(Composition::Wrapper), ", "));
      for (const auto& s : info.steps) {
        fmt::print("    offline step: kvbench {} {} MODEL [--out FILE] [-o key=value ...]\n", s.command, s.name);
        if (s.summary != info.summary) fmt::print("      {}\n", s.summary);
        for (const auto& p : s.options) fmt::print("      {:10} {}  {}\n", p.name, p.describe(), p.help);
      }
    }
  });
}

}  // namespace kvb::cli
