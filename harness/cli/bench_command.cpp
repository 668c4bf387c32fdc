// kvbench bench: prefill and decode speed at several context lengths, each figure also given as a
// fraction of the machine's own limits measured in the same run (BLAS GEMM rate, read bandwidth).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "harness/cli/commands.hpp"
#include "harness/engine/engine.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/error.hpp"
#include "harness/util/machine.hpp"

namespace kvb::cli {
namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

struct Spread {
  double median = 0, min = 0, max = 0;
};

Spread spread(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

struct Row {
  int context = 0;
  Spread prefill_tps, linear_gflops, attention_gflops, decode_tps;
  double linear_eff = 0, decode_bound_tps = 0, decode_eff = 0, linear_share = 0;
  size_t peak_rss = 0, kv_bytes = 0;
};

}  // namespace

void register_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Prefill and decode speed against the machine's measured limits");
  struct Args {
    std::string model, backend = "cpu", format = "md";
    std::vector<int> contexts = {512, 2048};
    int repeat = 3, decode_tokens = 32, threads = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("model", a->model, "GGUF file or Hugging Face model directory")->required();
  cmd->add_option("--context,-c", a->contexts, "Context lengths (repeatable)");
  cmd->add_option("--repeat,-r", a->repeat, "Runs per context; medians are reported")->check(CLI::PositiveNumber);
  cmd->add_option("--decode-tokens", a->decode_tokens, "Tokens decoded after each prefill")->check(CLI::PositiveNumber);
  cmd->add_option("--backend", a->backend, "cpu or cuda");
  cmd->add_option("--threads", a->threads, "Threads (0 = all cores)");
  cmd->add_option("--format", a->format, "md, csv or json")->check(CLI::IsMember({"md", "csv", "json"}));
  cmd->callback([a] {
    auto m = ModelFile::open(a->model);
    const ModelConfig& cfg = m->config();
    for (int c : a->contexts)
      if (c < 1 || c > cfg.context_length)
        fail("--context {}: must be between 1 and the model's context length {}", c, cfg.context_length);
    Engine engine(*m, {a->backend, a->threads});
    Backend& b = engine.backend();
    fmt::print(stderr, "measuring the machine: BLAS sgemm and read bandwidth...\n");
    const double gemm_peak = measure_sgemm_gflops();
    const double bandwidth = measure_read_bandwidth_gbs();
    // Bytes a decode step must read: every weight matrix (the embedding only as the tied output
    // head) plus the KV cache.
    const size_t embd = size_t(cfg.vocab_size) * cfg.hidden * sizeof(float);
    const size_t weights_read = engine.weight_bytes() - (cfg.tied_embeddings ? 0 : embd);

    std::mt19937 rng(0);
    std::vector<Row> rows;
    for (int ctx : a->contexts) {
      Row row;
      row.context = ctx;
      std::vector<double> p_tps, l_gf, a_gf, d_tps;
      reset_peak_rss();
      for (int r = 0; r < a->repeat; ++r) {
        std::vector<int32_t> ids(ctx);
        for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.vocab_size));
        b.set_profiling(true);
        b.reset_stats();
        auto t0 = std::chrono::steady_clock::now();
        auto logits = engine.prefill(ids);
        const double pre_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const OpStats st = b.stats();
        p_tps.push_back(ctx / pre_s);
        l_gf.push_back(st.linear_flops / st.linear_seconds / 1e9);
        a_gf.push_back(st.attention_flops / std::max(st.attention_seconds, 1e-12) / 1e9);
        row.linear_share = st.linear_seconds / pre_s;
        b.set_profiling(false);
        const int steps = std::min(a->decode_tokens, cfg.context_length - ctx);
        if (steps > 0) {
          int32_t tok = static_cast<int32_t>(rng() % 1000);
          t0 = std::chrono::steady_clock::now();
          for (int s = 0; s < steps; ++s) engine.decode(tok);
          const double dec_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          d_tps.push_back(steps / dec_s);
        }
        row.kv_bytes = engine.kv_bytes();
      }
      row.peak_rss = peak_rss_bytes();
      row.prefill_tps = spread(p_tps);
      row.linear_gflops = spread(l_gf);
      row.attention_gflops = spread(a_gf);
      row.linear_eff = row.linear_gflops.median / gemm_peak;
      if (!d_tps.empty()) {
        row.decode_tps = spread(d_tps);
        row.decode_bound_tps = bandwidth * 1e9 / static_cast<double>(weights_read + row.kv_bytes);
        row.decode_eff = row.decode_tps.median / row.decode_bound_tps;
      }
      rows.push_back(row);
      fmt::print(stderr, "  context {}: prefill {:.1f} tok/s, decode {:.1f} tok/s\n", ctx,
                 row.prefill_tps.median, row.decode_tps.median);
    }

    if (a->format == "json") {
      nlohmann::json j = {{"model", a->model}, {"backend", b.name()}, {"gemm_peak_gflops", gemm_peak},
                          {"read_bandwidth_gbs", bandwidth}, {"weights_read_bytes", weights_read},
                          {"repeat", a->repeat}};
      for (const auto& r : rows)
        j["rows"].push_back({{"context", r.context},
                             {"prefill_tokens_per_s", {r.prefill_tps.median, r.prefill_tps.min, r.prefill_tps.max}},
                             {"linear_gflops", r.linear_gflops.median}, {"linear_efficiency", r.linear_eff},
                             {"linear_time_share", r.linear_share}, {"attention_gflops", r.attention_gflops.median},
                             {"decode_tokens_per_s", {r.decode_tps.median, r.decode_tps.min, r.decode_tps.max}},
                             {"decode_bound_tokens_per_s", r.decode_bound_tps}, {"decode_efficiency", r.decode_eff},
                             {"kv_bytes", r.kv_bytes}, {"peak_rss_bytes", r.peak_rss}});
      fmt::print("{}\n", j.dump(2));
      return;
    }
    const bool md = a->format == "md";
    const char* sep = md ? " | " : ",";
    auto line = [&](const std::vector<std::string>& cells) {
      std::string s = md ? "| " : "";
      for (size_t i = 0; i < cells.size(); ++i) s += cells[i] + (i + 1 < cells.size() ? sep : "");
      fmt::print("{}{}\n", s, md ? " |" : "");
    };
    if (md)
      fmt::print("{} on {} backend; sgemm peak {:.1f} GFLOP/s, read bandwidth {:.1f} GB/s, weights read per "
                 "decode step {:.0f} MiB; medians of {} runs (min-max)\n\n",
                 a->model, b.name(), gemm_peak, bandwidth, mib(weights_read), a->repeat);
    line({"context", "prefill tok/s", "linear GFLOP/s", "linear / sgemm peak", "linear share of prefill",
          "attention GFLOP/s", "decode tok/s", "decode bound tok/s", "decode / bound", "KV MiB", "peak RSS MiB"});
    if (md) line(std::vector<std::string>(11, "---"));
    for (const auto& r : rows)
      line({std::to_string(r.context),
            fmt::format("{:.1f} ({:.1f}-{:.1f})", r.prefill_tps.median, r.prefill_tps.min, r.prefill_tps.max),
            fmt::format("{:.1f}", r.linear_gflops.median), fmt::format("{:.0f}%", 100 * r.linear_eff),
            fmt::format("{:.0f}%", 100 * r.linear_share), fmt::format("{:.1f}", r.attention_gflops.median),
            r.decode_bound_tps > 0
                ? fmt::format("{:.1f} ({:.1f}-{:.1f})", r.decode_tps.median, r.decode_tps.min, r.decode_tps.max)
                : "n/a (context full)",
            r.decode_bound_tps > 0 ? fmt::format("{:.1f}", r.decode_bound_tps) : "n/a",
            r.decode_bound_tps > 0 ? fmt::format("{:.0f}%", 100 * r.decode_eff) : "n/a",
            fmt::format("{:.1f}", mib(r.kv_bytes)), fmt::format("{:.0f}", mib(r.peak_rss))});
  });
}

}  // namespace kvb::cli
