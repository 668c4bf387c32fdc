// kvbench: KV-cache compression research harness.
#include <fmt/core.h>

#include "harness/cli/commands.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/util/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvbench: KV-cache compression research harness"};
  app.require_subcommand(1);
  app.set_version_flag("--version", fmt::format("kvbench 0.1.0 (code {})", kvb::code_version()));
  kvb::cli::register_model_commands(app);
  kvb::cli::register_engine_commands(app);
  kvb::cli::register_bench_command(app);
  kvb::cli::register_list_command(app);
  kvb::cli::register_task_commands(app);
  kvb::cli::register_run_command(app);
  kvb::cli::register_calibrate_command(app);
  kvb::cli::register_new_command(app);
  kvb::cli::register_slurm_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kvb::Error& e) {
    fmt::print(stderr, "kvbench: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
