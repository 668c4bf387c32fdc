// kvbench: KV-cache compression research harness.
#include <fmt/core.h>

#include "harness/cli/commands.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/blas_core.hpp"

int main(int argc, char** argv) {
  kvb::use_processor_blas_kernels(argv);
  CLI::App app{"kvbench: KV-cache compression research harness"};
  app.require_subcommand(1);
  // Every option's --help line shows its default (subcommands inherit the setting).
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", fmt::format("kvbench 0.1.0 (code {})", kvb::code_version()));
  for (auto* add :
       {kvb::cli::register_info_command, kvb::cli::register_tokenize_command, kvb::cli::register_detokenize_command,
        kvb::cli::register_make_model_command, kvb::cli::register_generate_command, kvb::cli::register_logits_command,
        kvb::cli::register_grad_command, kvb::cli::register_bench_command, kvb::cli::register_list_command,
        kvb::cli::register_dump_prefill_command, kvb::cli::register_sample_command, kvb::cli::register_run_task_command,
        kvb::cli::register_score_command, kvb::cli::register_report_command, kvb::cli::register_run_command,
        kvb::cli::register_calibrate_command, kvb::cli::register_new_command, kvb::cli::register_submit_command,
        kvb::cli::register_status_command})
    add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const kvb::Error& e) {
    fmt::print(stderr, "kvbench: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    // What a check missed (a file system failure, a library's exception): still a message, never an abort.
    fmt::print(stderr, "kvbench: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
