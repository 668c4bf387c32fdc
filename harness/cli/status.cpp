// kvbench status DIR: cells done, pending and failed per shard of a submitted sweep, with Slurm states.
#include <filesystem>

#include "harness/cli/commands.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/slurm.hpp"

namespace kvb::cli {

void register_status_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("status",
                                 "Cells done, pending and failed per shard of a submitted sweep, with "
                                 "each task's Slurm state and the ETA");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("dir", *dir, "Directory written by kvbench submit")->required();
  cmd->callback([dir] { slurm_status(*dir); });
}

}  // namespace kvb::cli
