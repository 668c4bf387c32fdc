// kvbench make-model: a random-weight GGUF with the shapes of a real model.
#include <fmt/format.h>
#include <fstream>
#include <map>

#include <sstream>

#include "harness/cli/commands.hpp"
#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
#include "harness/model/random_model.hpp"
#include "harness/tokenizer/chat_template.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

void register_make_model_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-model", "Write a random-weight model with the shapes of a real one");
  struct Args {
    std::string shape, out, type = "f16";
    int layers = 0;
    uint64_t seed = 0;
  };
  auto a = std::make_shared<Args>();
  std::string names;
  for (const auto& s : known_model_shapes()) names += (names.empty() ? "" : ", ") + s.name;
  cmd->add_option("shape", a->shape, "Shape to copy: " + names)->required();
  cmd->add_option("--out,-o", a->out, "GGUF file to write")->required();
  cmd->add_option("--type", a->type,
                  "Weight type: f32, f16, bf16, or q4_k_m (Q4_K matrices; Q6_K attn_v, ffn_down and output; "
                  "K-quants need each matrix's rows in whole blocks of 256)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q4_k_m"}));
  cmd->add_option("--layers", a->layers, "Keep only this many layers (0: all)");
  cmd->add_option("--seed", a->seed, "Random seed");
  cmd->callback([a] {
    ModelShape s = model_shape(a->shape);
    if (a->layers < 0 || a->layers > s.layers) fail("--layers {}: must be between 0 and {}", a->layers, s.layers);
    if (a->layers) s.layers = a->layers;
    const DType t = a->type == "f32"      ? DType::F32
                    : a->type == "bf16"   ? DType::BF16
                    : a->type == "q4_k_m" ? DType::Q4_K
                                          : DType::F16;
    write_random_model(a->out, s, t, a->seed);
    fmt::print(stderr, "wrote {} ({} layers, random weights, seed {})\n", a->out, s.layers, a->seed);
  });
}

}  // namespace kvb::cli
