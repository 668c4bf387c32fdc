// kvbench grad: the next-token loss of a sequence and its gradients (the backward pass).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/cli/commands.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/generate.hpp"
#include "harness/engine/gradients.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/npy.hpp"

namespace kvb::cli {

namespace {

struct GradArgs {
  std::string model, text, ids, weights = "kv", out;
  int tokens = 0, threads = 0;
};

// The sequence: token ids from --ids as they are, or --text as a prompt (BOS where the tokenizer adds
// one); the first --tokens.
std::vector<int32_t> sequence(const GradArgs& a, const ModelFile& m) {
  std::vector<int32_t> ids;
  if (!a.ids.empty()) {
    std::ifstream in(a.ids);
    if (!in) fail("--ids {}: cannot read", a.ids);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail("--ids {}: not valid JSON ({})", a.ids, e.what());
    }
    const int vocab = m.config().vocab_size;
    if (!j.is_array()) fail("--ids {}: expected a JSON list of integer token ids", a.ids);
    for (size_t i = 0; i < j.size(); ++i) {
      if (!j[i].is_number_integer() || j[i].get<long long>() < 0 || j[i].get<long long>() >= vocab)
        fail("--ids {}: entry {} is {}, not a token id of this model (0 to {})", a.ids, i, j[i].dump(), vocab - 1);
      ids.push_back(j[i].get<int32_t>());
    }
  } else if (!a.text.empty()) {
    auto tok = load_tokenizer(m);
    ids = build_prompt(m, *tok, a.text, false);
  } else {
    fail("grad: give --text or --ids");
  }
  if (a.tokens > 0 && size_t(a.tokens) < ids.size()) ids.resize(size_t(a.tokens));
  return ids;
}

// --weights: all, kv (every layer's attn_k/attn_v) or tensor names, comma-separated.
std::set<std::string> wanted_tensors(const std::string& spec, const std::vector<std::string>& names) {
  std::set<std::string> want;
  for (size_t b = 0; b <= spec.size();) {
    const size_t e = std::min(spec.find(',', b), spec.size());
    const std::string part = spec.substr(b, e - b);
    b = e + 1;
    if (part.empty()) continue;
    for (const auto& n : names)
      if (part == "all" || (part == "kv" && (n.ends_with("attn_k.weight") || n.ends_with("attn_v.weight"))))
        want.insert(n);
    if (part != "all" && part != "kv") want.insert(part);
  }
  return want;
}

// meta.json (loss, ids, Frobenius norms) and one <tensor>.npy per gradient, in `dir`.
void write_gradients(const std::string& dir, const ModelFile& m, const ModelGradients& mg, const LossGradients& g,
                     const std::vector<int32_t>& ids, double seconds, const nlohmann::json& norms) {
  std::filesystem::create_directories(dir);
  nlohmann::json meta = {{"model", m.path()},
                         {"model_fingerprint", m.config().fingerprint},
                         {"loss", g.loss},
                         {"n_targets", g.n_targets},
                         {"ids", ids},
                         {"seconds", seconds},
                         {"tensors", nlohmann::json::array()},
                         {"frobenius", norms}};
  for (const auto& [name, v] : g.grads) {
    const auto [rows, cols] = mg.shape(name);
    write_npy(dir + "/" + name + ".npy", v,
              cols == 1 || rows == 1 ? std::vector<size_t>{v.size()} : std::vector<size_t>{size_t(rows), size_t(cols)});
    meta["tensors"].push_back(name);
  }
  std::ofstream(dir + "/meta.json") << meta.dump(2) << "\n";
  fmt::print("wrote {} gradients and meta.json to {}\n", g.grads.size(), dir);
}

void run_grad(const GradArgs& a) {
  if (a.threads > 0) set_cpu_threads(a.threads);
  auto m = ModelFile::open(a.model);
  const std::vector<int32_t> ids = sequence(a, *m);
  ModelGradients mg(*m);
  const auto t0 = std::chrono::steady_clock::now();
  const LossGradients g = mg.compute(ids, wanted_tensors(a.weights, mg.tensor_names()));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nlohmann::json norms = nlohmann::json::object();
  for (const auto& [name, v] : g.grads) {
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    norms[name] = std::sqrt(ss);
  }
  fmt::print("loss {:.6f} over {} targets; {} gradients in {:.2f} s ({:.0f} tokens/s)\n", g.loss, g.n_targets,
             g.grads.size(), seconds, double(ids.size()) / seconds);
  for (const auto& [name, norm] : norms.items()) fmt::print("  {:28} |grad|_F {:.6g}\n", name, norm.get<double>());
  if (!a.out.empty()) write_gradients(a.out, *m, mg, g, ids, seconds, norms);
}

}  // namespace

void register_grad_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "grad", "Next-token loss of a sequence and its gradients (the backward pass), optionally written as .npy");
  auto a = std::make_shared<GradArgs>();
  cmd->add_option("model", a->model, "GGUF file or Hugging Face model directory")->required();
  auto* text = cmd->add_option("--text,-t", a->text,
                               "Input text (as a prompt: BOS where the tokenizer adds one; no chat template)");
  cmd->add_option("--ids", a->ids, "JSON file holding a list of token ids (used as they are)")->excludes(text);
  cmd->add_option("--tokens", a->tokens, "Keep the first N tokens (0: all)")->check(kNonNegative);
  cmd->add_option("--weights", a->weights,
                  "Gradients of: all, kv (every layer's attn_k/attn_v), or comma-separated tensor names");
  cmd->add_option("--out", a->out, "Directory for meta.json and one <tensor>.npy per gradient");
  cmd->add_option("--threads", a->threads, "Threads (0 = all cores)")->check(kNonNegative);
  cmd->callback([a] { run_grad(*a); });
}

}  // namespace kvb::cli
