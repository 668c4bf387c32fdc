#pragma once
// Each group of subcommands registers itself on the CLI11 app.
#include <CLI/CLI.hpp>

namespace kvb::cli {

void register_model_commands(CLI::App& app);
void register_engine_commands(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_list_command(CLI::App& app);

}  // namespace kvb::cli
