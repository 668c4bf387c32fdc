// kvbench bench: prefill and decode speed at several context lengths, each figure also given as a
// fraction of the backend's own hardware limits measured in the same run (GEMM rate, memory
// bandwidth); optionally decode speed with compressed caches (methods at several KV sizes, and the
// same kept tokens stored as low-rank segments) against full attention; and at several batch sizes,
// B sequences (each its own prompt and cache) decoding together, or at the largest batch that fits
// a memory cap (KVmix's throughput protocol: 688 prompt tokens, 1,024 new).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <random>

#include "harness/cache/lowrank_segment.hpp"
#include "harness/cli/commands.hpp"
#include "harness/engine/engine.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/report/table.hpp"
#include "harness/report/throughput_plot.hpp"
#include "harness/util/error.hpp"
#include "harness/util/params.hpp"

namespace kvb::cli {

namespace {

double mib(size_t bytes) { return static_cast<double>(bytes) / 1048576.0; }

struct Spread {
  double median = 0, min = 0, max = 0;
};

Spread spread(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

struct Row {
  int context = 0;
  std::string cache = "full";
  int batch = 1;  // sequences decoding together; decode tok/s counts the tokens of all of them
  Spread prefill_tps, decode_tps;
  double prefill_tflops = 0, linear_tflops = 0, attention_tflops = 0, linear_eff = 0, linear_share = 0;
  double attention_eff = 0;    // attention flops rate / the GEMM peak
  double attention_share = 0;  // attention time / prefill time (profiled)
  double compress_share = 0;   // compression time / prefill time
  int profiled_prefills = 0;   // the per-operation figures are their medians
  double transform_share = 0;  // decode time in the method's KV transform (a model-changing method)
  double decode_bound_tps = 0, decode_eff = 0, decode_speedup = 0;
  // The bound again with the bandwidth at which the step's bytes, read again and again, come in: above the
  // memory's where they fit in a cache (the backend's measure; 0 where it has none).
  double working_set_gbs = 0, decode_ws_bound_tps = 0, decode_ws_eff = 0;
  size_t decode_step_bytes = 0;          // what a decode step reads: the weights it multiplies and every cache
  double bytes_ratio = 0;                // the full cache's step bytes over this row's: the speed-up its bytes promise
  double decode_gemv_eff = 0;            // weight bytes / time of the decode step's matrix products, vs bandwidth
  size_t peak_memory = 0, kv_bytes = 0;  // kv_bytes: all the batch's caches
  size_t accounted = 0;                  // weights + every cache + the batch's decode buffers
};

// Replaces each head's dense tokens, after the wrapped observer has chosen them, by low-rank
// segments of rank r for keys and values over an orthonormal basis per layer (a random one: this
// measures decode speed only, not accuracy).
class LowRankStore final : public PrefillObserver {
 public:
  LowRankStore(PrefillObserver& inner, int rank, int head_dim) : inner_(inner), rank_(rank) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    // Gram-Schmidt on random columns.
    std::vector<float> P(size_t(head_dim) * rank);
    for (int j = 0; j < rank; ++j) {
      std::vector<double> col(head_dim);
      for (auto& x : col) x = nd(rng);
      for (int i = 0; i < j; ++i) {
        double dot = 0;
        for (int r = 0; r < head_dim; ++r) dot += col[r] * P[size_t(r) * rank + i];
        for (int r = 0; r < head_dim; ++r) col[r] -= dot * P[size_t(r) * rank + i];
      }
      double norm = 0;
      for (double x : col) norm += x * x;
      for (int r = 0; r < head_dim; ++r) P[size_t(r) * rank + j] = static_cast<float>(col[r] / std::sqrt(norm));
    }
    auto b = std::make_shared<LowRankBasis>();
    b->head_dim = head_dim;
    b->rank = rank;
    b->k = P;
    b->v = P;
    basis_ = b;
  }
  PrefillNeeds needs() const override { return inner_.needs(); }
  void on_layer(const PrefillView& view, LayerCache& cache) override {
    inner_.on_layer(view, cache);
    for (int h = 0; h < cache.n_cache_heads(); ++h) {
      auto& segs = cache.segments(h);
      auto low = std::make_unique<LowRankSegment>(basis_, rank_, rank_, h == 0);
      for (const auto& s : segs) {
        const auto* dense = dynamic_cast<const DenseSegment*>(s.get());
        if (!dense)
          fail(
              "--lowrank: this method's cache holds its own format, not plain dense rows to project; --lowrank applies "
              "to methods that select tokens");
        const auto& d = *dense;
        std::vector<float> k(d.size() * d.head_dim()), v(k.size());
        d.read(0, d.size(), k.data(), v.data());
        for (size_t t = 0; t < d.size(); ++t)
          low->append(k.data() + t * d.head_dim(), v.data() + t * d.head_dim(), d.positions()[t]);
      }
      segs.clear();
      segs.push_back(std::move(low));
    }
  }

 private:
  PrefillObserver& inner_;
  int rank_;
  std::shared_ptr<const LowRankBasis> basis_;
};

struct BenchArgs : EngineArgs {
  std::string model, format = "md", plot;
  std::vector<int> contexts = {512, 2048}, budgets, batches = {1};
  std::vector<std::string> methods, params;
  int repeat = 3, decode_tokens = 32, lowrank = 0;
  double memory_cap_gib = 0;      // each configuration at the largest batch that fits in this many GiB
  bool memory_cap_given = false;  // --memory-cap given (0 and values below a byte are errors, not "no cap")
};

// The observer of one measured prefill (none: the full cache), and the runner inside it; the sequence's
// own method where the method keeps state per sequence.
struct Observer {
  std::unique_ptr<Method> own;
  std::unique_ptr<MethodRunner> runner;
  std::unique_ptr<LowRankStore> lowrank;
  PrefillObserver* observer = nullptr;
};

std::string pct(double x) { return fmt::format("{:.0f}%", 100 * x); }
std::string tps(const Spread& s) { return fmt::format("{:.1f} ({:.1f}-{:.1f})", s.median, s.min, s.max); }

// Markdown or CSV rows, printed as the configurations of each context and batch size finish.
class Table {
 public:
  explicit Table(bool md) : md_(md) {}
  void header(const std::string& title) const {
    if (md_) fmt::print("{}\n\n", title);
    const std::vector<std::string> head = {"context",
                                           "cache",
                                           "batch",
                                           "prefill tok/s",
                                           "prefill TFLOP/s",
                                           "linear TFLOP/s",
                                           "linear / GEMM peak",
                                           "linear share",
                                           "attention TFLOP/s",
                                           "attention / GEMM peak",
                                           "attention share",
                                           "compression share",
                                           "decode tok/s",
                                           "decode bound tok/s",
                                           "decode / bound",
                                           "working-set GB/s",
                                           "decode / working-set bound",
                                           "decode GEMV / bandwidth",
                                           "decode vs full",
                                           "step MiB",
                                           "bytes promise",
                                           "decode transform share",
                                           "KV MiB",
                                           "accounted MiB",
                                           "peak memory MiB"};
    line(head);
    if (md_) line(std::vector<std::string>(head.size(), "---"));
  }
  void row(const Row& r) const {
    const bool dec = r.decode_bound_tps > 0;
    line({std::to_string(r.context),
          r.cache,
          std::to_string(r.batch),
          tps(r.prefill_tps),
          fmt::format("{:.3f}", r.prefill_tflops),
          fmt::format("{:.3f}", r.linear_tflops),
          pct(r.linear_eff),
          pct(r.linear_share),
          fmt::format("{:.3f}", r.attention_tflops),
          pct(r.attention_eff),
          pct(r.attention_share),
          r.cache == "full" ? "-" : fmt::format("{:.1f}%", 100 * r.compress_share),
          dec ? tps(r.decode_tps) : "n/a",
          dec ? fmt::format("{:.1f}", r.decode_bound_tps) : "n/a",
          dec ? pct(r.decode_eff) : "n/a",
          r.working_set_gbs > 0 ? fmt::format("{:.1f}", r.working_set_gbs) : "n/a",
          r.working_set_gbs > 0 ? pct(r.decode_ws_eff) : "n/a",
          r.decode_gemv_eff > 0 ? pct(r.decode_gemv_eff) : "n/a",
          r.decode_speedup > 0 ? fmt::format("{:.2f}x", r.decode_speedup) : "-",
          dec ? fmt::format("{:.1f}", mib(r.decode_step_bytes)) : "n/a",
          r.bytes_ratio > 0 ? fmt::format("{:.2f}x", r.bytes_ratio) : "-",
          r.transform_share > 0 ? fmt::format("{:.1f}%", 100 * r.transform_share) : "-",
          fmt::format("{:.1f}", mib(r.kv_bytes)),
          fmt::format("{:.0f}", mib(r.accounted)),
          fmt::format("{:.0f}", mib(r.peak_memory))});
    std::fflush(stdout);  // rows of long runs appear as they finish
  }

 private:
  void line(const std::vector<std::string>& cells) const {
    std::vector<std::string> quoted;
    for (const auto& c : cells) quoted.push_back(md_ ? markdown_cell(c) : csv_field(c));
    if (md_)
      fmt::print("| {} |\n", fmt::join(quoted, " | "));
    else
      fmt::print("{}\n", fmt::join(quoted, ","));
  }
  bool md_;
};

nlohmann::json row_json(const Row& r) {
  return {{"context", r.context},
          {"cache", r.cache},
          {"batch", r.batch},
          {"prefill_tokens_per_s", {r.prefill_tps.median, r.prefill_tps.min, r.prefill_tps.max}},
          {"prefill_tflops", r.prefill_tflops},
          {"linear_tflops", r.linear_tflops},
          {"linear_efficiency", r.linear_eff},
          {"linear_time_share", r.linear_share},
          {"attention_tflops", r.attention_tflops},
          {"attention_efficiency", r.attention_eff},
          {"attention_time_share", r.attention_share},
          {"compress_time_share", r.compress_share},
          {"profiled_prefills", r.profiled_prefills},
          {"decode_transform_share", r.transform_share},
          {"decode_tokens_per_s", {r.decode_tps.median, r.decode_tps.min, r.decode_tps.max}},
          {"decode_bound_tokens_per_s", r.decode_bound_tps},
          {"decode_efficiency", r.decode_eff},
          {"working_set_bandwidth_gbs", r.working_set_gbs},
          {"decode_working_set_bound_tokens_per_s", r.decode_ws_bound_tps},
          {"decode_working_set_efficiency", r.decode_ws_eff},
          {"decode_gemv_bandwidth_fraction", r.decode_gemv_eff},
          {"decode_speedup_vs_full", r.decode_speedup},
          {"decode_step_bytes", r.decode_step_bytes},
          {"decode_bytes_ratio_vs_full", r.bytes_ratio},
          {"kv_bytes", r.kv_bytes},
          {"accounted_bytes", r.accounted},
          {"peak_memory_bytes", r.peak_memory}};
}

// Decode tokens/s against batch size, one series per cache configuration (and context, given several).
ThroughputPlot throughput_plot(const std::vector<Row>& rows, const std::string& title, bool by_context) {
  ThroughputPlot p;
  p.title = title;
  for (const auto& r : rows) {
    if (r.decode_tps.median <= 0) continue;
    const std::string label = by_context ? fmt::format("{}, context {}", r.cache, r.context) : r.cache;
    auto it = std::find_if(p.series.begin(), p.series.end(), [&](const auto& s) { return s.label == label; });
    if (it == p.series.end()) it = p.series.insert(p.series.end(), {label, {}});
    it->points.push_back({r.batch, r.decode_tps.median});
  }
  if (p.series.empty()) fail("--plot: no row decoded (--decode-tokens 0, or no room in the context)");
  return p;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The measurements of one model on one backend.
class Bench {
 public:
  Bench(const BenchArgs& a, const ModelFile& m)
      : a_(a), cfg_(m.config()), engine_(m, engine_options(a)), b_(engine_.backend()) {
    fmt::print(stderr, "measuring the {} backend's hardware: GEMM rate and memory bandwidth...\n", b_.name());
    limits_ = b_.measure_limits();
    weights_read_ = engine_.decode_weight_bytes();
  }

  std::string title() const {
    return fmt::format(
        "{} on {} backend; {} peak {}, bandwidth {:.1f} GB/s, weights read per decode step {:.0f} MiB ({} weights); "
        "KV cache stored as {}; medians of {} runs (min-max), the configurations taking turns",
        a_.model, b_.name(), limits_.gemm_kind,
        // GFLOP/s where a TFLOP/s figure would round to a digit or two (CPUs)
        limits_.gemm_gflops < 1000 ? fmt::format("{:.0f} GFLOP/s", limits_.gemm_gflops)
                                   : fmt::format("{:.1f} TFLOP/s", limits_.gemm_gflops / 1e3),
        limits_.bandwidth_gbs, mib(weights_read_), weight_format_name(engine_.weight_format()), a_.kv_dtype, a_.repeat);
  }

  std::string plot_title() const {
    return fmt::format("{}, {} weights, {} cache, {} backend", std::filesystem::path(a_.model).filename().string(),
                       weight_format_name(engine_.weight_format()), a_.kv_dtype, b_.name());
  }

  nlohmann::json json(const std::vector<Row>& rows) const {
    nlohmann::json j = {{"model", a_.model},
                        {"backend", b_.name()},
                        {"kv_dtype", a_.kv_dtype},
                        {"weights", weight_format_name(engine_.weight_format())},
                        {"gemm_kind", limits_.gemm_kind},
                        {"gemm_peak_gflops", limits_.gemm_gflops},
                        {"bandwidth_gbs", limits_.bandwidth_gbs},
                        {"weights_read_bytes", weights_read_},
                        {"repeat", a_.repeat}};
    for (const auto& r : rows) j["rows"].push_back(row_json(r));
    return j;
  }

  // The runs of one configuration at one context and batch size, gathered a run at a time so that the
  // configurations of a context take turns: their ratios then see the same moments of a shared machine.
  // A profiled prefill's per-operation figures.
  struct Profile {
    double linear_tflops = 0, attention_tflops = 0, linear_share = 0, attention_share = 0, compress_share = 0;
  };
  struct Runs {
    Row row;
    std::vector<double> p_tps, d_tps;
    std::vector<Profile> profiles;  // one a run: each row's figures are medians, as its speeds are
    double flops = 0;               // of one prefill, from the profiled ones
    int runs = 0;
  };
  static Runs start(int ctx, int batch, const std::string& label) {
    Runs x;
    x.row.context = ctx;
    x.row.cache = label;
    x.row.batch = batch;
    return x;
  }
  // One run: each sequence's prompt prefilled, all of them decoded together, then the first prompt
  // prefilled again with per-operation timing. `make_observer` gives the prefill observer of each sequence. The prompts
  // and decoded tokens depend on the context and the run's number only: every configuration's run r reads the same
  // ones.
  void run_once(Runs& x, const std::function<Observer()>& make_observer) {
    Row& row = x.row;
    const bool first = x.runs++ == 0;
    std::seed_seq seed{row.context, x.runs};
    std::mt19937 rng(seed);
    b_.reset_peak_memory();
    std::vector<Observer> holders;
    std::vector<Sequence> seqs;
    std::vector<int32_t> first_ids;
    for (int s = 0; s < row.batch; ++s) {
      std::vector<int32_t> ids(row.context);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg_.vocab_size));
      if (s == 0) first_ids = ids;
      holders.push_back(make_observer());
      const auto t0 = std::chrono::steady_clock::now();
      engine_.prefill(ids, holders.back().observer);
      b_.synchronize();
      const double pre_s = seconds_since(t0);
      x.p_tps.push_back(row.context / pre_s);
      seqs.push_back(engine_.detach());
    }
    if (const double d = time_decode(row.context, row, seqs, rng); d > 0) x.d_tps.push_back(d);
    row.kv_bytes = 0;
    for (const auto& sq : seqs) row.kv_bytes += sq.kv_bytes();
    // From the first run, which follows only the earlier configurations' first runs: a backend's scratch
    // buffers that grow and stay (CUDA's) then count as they did when each configuration ran whole.
    if (first) row.peak_memory = b_.peak_memory_bytes();
    // After the timed work, which then follows what it followed before each run had its profile.
    x.profiles.push_back(profile_prefill(first_ids, make_observer(), x.flops));
  }
  // The row of the runs. full: the full cache's row at this context, at this batch or under --memory-cap
  // at its own (null for the full cache itself), for the speed-up and the bytes ratio.
  Row finish(const Runs& x, const Row* full) {
    Row row = x.row;
    row.accounted = engine_.weight_bytes() + row.kv_bytes + size_t(row.batch) * engine_.decode_buffer_bytes();
    row.prefill_tps = spread(x.p_tps);
    row.prefill_tflops = x.flops * row.prefill_tps.median / row.context / 1e12;
    // Medians over the runs: one profile alone moved 25-fold on a machine shared with other work.
    auto median = [&](double Profile::*field) {
      std::vector<double> v;
      for (const Profile& p : x.profiles) v.push_back(p.*field);
      return spread(v).median;
    };
    row.linear_tflops = median(&Profile::linear_tflops);
    row.attention_tflops = median(&Profile::attention_tflops);
    row.linear_share = median(&Profile::linear_share);
    row.attention_share = median(&Profile::attention_share);
    row.compress_share = median(&Profile::compress_share);
    row.profiled_prefills = static_cast<int>(x.profiles.size());
    row.linear_eff = row.linear_tflops * 1e3 / limits_.gemm_gflops;
    row.attention_eff = row.attention_tflops * 1e3 / limits_.gemm_gflops;
    if (!x.d_tps.empty()) {
      row.decode_tps = spread(x.d_tps);
      row.decode_step_bytes = weights_read_ + row.kv_bytes;
      // Tokens/s if every step read its bytes at `gbs`.
      auto bound = [&](double gbs) { return row.batch * gbs * 1e9 / static_cast<double>(row.decode_step_bytes); };
      row.decode_bound_tps = bound(limits_.bandwidth_gbs);
      row.decode_eff = row.decode_tps.median / row.decode_bound_tps;
      // After the runs, so that their caches are freed; the measure reads a buffer of the step's size.
      row.working_set_gbs = b_.measure_working_set_bandwidth(row.decode_step_bytes);
      if (row.working_set_gbs > 0) {
        row.decode_ws_bound_tps = bound(row.working_set_gbs);
        row.decode_ws_eff = row.decode_tps.median / row.decode_ws_bound_tps;
      }
      if (full && full->decode_step_bytes > 0) {
        row.decode_speedup = row.decode_tps.median / full->decode_tps.median;
        // Per generated token, so that rows at other batch sizes (under --memory-cap) compare.
        row.bytes_ratio = static_cast<double>(full->decode_step_bytes) / full->batch /
                          (static_cast<double>(row.decode_step_bytes) / row.batch);
      }
    }
    return row;
  }

  // The largest batch whose weights, caches and decode buffers fit in `cap` bytes: one sequence of the
  // configuration runs the whole protocol (its prompt, then every decode step) for its cache's final
  // size.
  int fit_batch(int ctx, const std::function<Observer()>& make_observer, size_t cap) {
    const int steps = timed_steps(ctx) + profiled_steps(ctx);
    std::vector<int32_t> ids(ctx);
    for (auto& id : ids) id = static_cast<int32_t>(rng_() % static_cast<uint32_t>(cfg_.vocab_size));
    auto holder = make_observer();
    engine_.prefill(ids, holder.observer);
    const auto tok = static_cast<int32_t>(rng_() % static_cast<uint32_t>(std::min(1000, cfg_.vocab_size)));
    for (int s = 0; s < steps; ++s) engine_.decode(tok);
    const size_t weights = engine_.weight_bytes(), cache = engine_.kv_bytes(), buffers = engine_.decode_buffer_bytes();
    if (weights + cache + buffers > cap)
      fail(
          "--memory-cap {:.3f} GiB ({} bytes) is below what one sequence needs: {} bytes ({:.1f} MiB of weights, "
          "{:.1f} MiB of cache after {} prompt and {} decoded tokens, {:.1f} MiB of decode buffers)",
          a_.memory_cap_gib, cap, weights + cache + buffers, mib(weights), mib(cache), ctx, steps, mib(buffers));
    const size_t fits = (cap - weights) / (cache + buffers);
    constexpr size_t kMaxBatch = 65536;
    if (fits > kMaxBatch)
      fail(
          "--memory-cap {} GiB fits {} sequences of {:.2f} MiB each, more than one run decodes ({}); give a cap "
          "this machine has",
          a_.memory_cap_gib, fits, mib(cache + buffers), kMaxBatch);
    const int batch = static_cast<int>(fits);
    fmt::print(stderr, "{:.1f} MiB of weights, {:.2f} MiB per sequence: batch {} fits {:.3f} GiB\n", mib(weights),
               mib(cache + buffers), batch, a_.memory_cap_gib);
    return batch;
  }

 private:
  // Per-operation rates and shares from one profiled prefill: profiling synchronises a GPU after
  // every operation, which serialises the host's share of a layer with the device's, so the speed
  // comes from the unprofiled runs.
  Profile profile_prefill(const std::vector<int32_t>& ids, Observer probe, double& flops) {
    b_.set_profiling(true);
    b_.reset_stats();
    const auto t0 = std::chrono::steady_clock::now();
    engine_.prefill(ids, probe.observer);
    const double s = seconds_since(t0);
    b_.set_profiling(false);
    const OpStats st = b_.stats();
    flops = st.linear_flops + st.attention_flops;
    return {.linear_tflops = st.linear_flops / std::max(st.linear_seconds, 1e-12) / 1e12,
            .attention_tflops = st.attention_flops / std::max(st.attention_seconds, 1e-12) / 1e12,
            .linear_share = st.linear_seconds / s,
            .attention_share = st.attention_seconds / s,
            .compress_share = probe.runner ? probe.runner->compress_seconds() / s : 0.0};
  }

  // Decode steps after a prompt of `ctx` tokens: those timed (the first of them untimed, as it sends
  // the caches to a device), then a few with per-operation timing.
  int timed_steps(int ctx) const { return std::min(a_.decode_tokens, cfg_.context_length - ctx); }
  int profiled_steps(int ctx) const { return std::max(0, std::min(4, cfg_.context_length - ctx - timed_steps(ctx))); }

  // Decodes the sequences together after their prefills of `ctx` tokens; returns tokens per second
  // over the batch (0 when too few steps fit).
  double time_decode(int ctx, Row& row, std::vector<Sequence>& seqs, std::mt19937& rng) {
    const int steps = timed_steps(ctx);
    if (steps <= 0) return 0;
    std::vector<Sequence*> batch;
    std::vector<int32_t> toks;
    for (auto& sq : seqs) {
      batch.push_back(&sq);
      toks.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(std::min(1000, cfg_.vocab_size))));
    }
    auto step = [&] { engine_.decode_batch(batch, toks); };
    step();  // the first step sends the caches to a device; not timed
    b_.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    const double tr0 = engine_.transform_seconds();
    for (int s = 1; s < steps; ++s) step();
    b_.synchronize();
    const double dec_s = seconds_since(t0);
    row.transform_share = (engine_.transform_seconds() - tr0) / dec_s;
    // A few more steps with per-operation timing (it synchronises, so not in the speed).
    if (const int prof = profiled_steps(ctx); prof > 0) {
      b_.set_profiling(true);
      b_.reset_stats();
      for (int s = 0; s < prof; ++s) step();
      b_.set_profiling(false);
      row.decode_gemv_eff =
          static_cast<double>(weights_read_) * prof / b_.stats().linear_seconds / 1e9 / limits_.bandwidth_gbs;
    }
    return steps > 1 ? double(steps - 1) * double(seqs.size()) / dec_s : 0;
  }

  const BenchArgs& a_;
  const ModelConfig& cfg_;
  Engine engine_;
  Backend& b_;
  DeviceLimits limits_;
  size_t weights_read_ = 0;
  std::mt19937 rng_{0};
};

void run_bench(const BenchArgs& a) {
  auto m = ModelFile::open(a.model);
  const ModelConfig& cfg = m->config();
  for (int c : a.contexts)
    if (c < 1 || c > cfg.context_length)
      fail("--context {}: must be between 1 and the model's context length {}", c, cfg.context_length);
  // Each --method is NAME or NAME:key=value,... (its own parameters over the shared --param ones).
  struct MethodRun {
    std::string label, name;
    std::map<std::string, std::string> params;
    std::unique_ptr<Method> method;
  };
  std::vector<MethodRun> methods;
  for (const std::string& spec : a.methods) {
    const NamedParams named = parse_named_params(spec, "--method");
    // --param goes to every method; a method's own parameters override it.
    auto kv = parse_key_values(a.params);
    std::vector<std::string> own;
    for (const auto& [k, v] : named.params) {
      own.push_back(k + "=" + v);
      kv[k] = v;
    }
    methods.push_back({own.empty() ? named.name : fmt::format("{}({})", named.name, fmt::join(own, ",")), named.name,
                       kv, MethodRegistry::get().create(named.name, kv, cfg)});
  }
  // A method that sets its own memory (KVmix) runs without KV sizes: one row; the others at each --budget.
  const bool any_budgeted =
      std::any_of(methods.begin(), methods.end(), [](const MethodRun& r) { return r.method->budgeted(); });
  if (methods.empty() && !a.budgets.empty()) fail("--budget needs --method");
  for (const MethodRun& r : methods)
    if (r.method->budgeted() && a.budgets.empty()) fail("--method {} needs --budget (KV sizes T)", r.label);
  if (!methods.empty() && !any_budgeted && !a.budgets.empty())
    fail("--method {} takes no --budget: it sets its own memory", methods.front().label);
  if (a.lowrank < 0 || a.lowrank > cfg.head_dim) fail("--lowrank {}: must be in [1, {}]", a.lowrank, cfg.head_dim);
  if (a.lowrank && !any_budgeted) fail("--lowrank needs --method and --budget");
  for (int B : a.batches)
    if (B < 1) fail("--batch {}: must be at least 1", B);
  for (int T : a.budgets)
    if (T < 1) fail("--budget {}: must be a positive number of tokens (KV size T)", T);
  // A cap far above any machine's memory would overflow the batch size; 2^20 GiB is a petabyte.
  if (a.memory_cap_given && !(a.memory_cap_gib * 1073741824.0 >= 1 && a.memory_cap_gib <= 1 << 20))
    fail("--memory-cap {}: must be a number of GiB, at least one byte and at most 2^20", a.memory_cap_gib);
  const auto cap = a.memory_cap_given ? static_cast<size_t>(a.memory_cap_gib * 1073741824.0) : size_t(0);

  if (const auto dir = std::filesystem::path(a.plot).parent_path();
      !a.plot.empty() && !dir.empty() && !std::filesystem::is_directory(dir))
    fail("--plot {}: the folder {} does not exist", a.plot, dir.string());

  Bench bench(a, *m);
  const Table table(a.format == "md");
  const bool json = a.format == "json";
  if (!json) table.header(bench.title());
  auto compressed = [&](const MethodRun& r, KvBudget budget, int rank) {
    Observer h;
    // A batch's sequences each need their own method where it keeps state per sequence between prefill
    // and decoding; one shared would have them evict by, or append to, another sequence's. The others
    // (Atom and its made weights among them) are shared by the whole batch.
    Method* method = r.method.get();
    if (method->keeps_sequence_state()) {
      h.own = MethodRegistry::get().create(r.name, r.params, cfg);
      method = h.own.get();
    }
    h.runner = std::make_unique<MethodRunner>(*method, budget);
    h.observer = h.runner.get();
    if (rank) {
      h.lowrank = std::make_unique<LowRankStore>(*h.runner, rank, cfg.head_dim);
      h.observer = h.lowrank.get();
    }
    return h;
  };
  struct Config {
    std::string label;
    std::function<Observer()> make;
  };
  std::vector<Config> configs = {{"full", [] { return Observer{}; }}};
  for (const MethodRun& r : methods) {
    if (!r.method->budgeted())
      configs.push_back({r.label, [&compressed, &r] { return compressed(r, KvBudget{}, 0); }});
    else
      for (int T : a.budgets) {
        configs.push_back({fmt::format("{} T={}", r.label, T), [&compressed, &r, T] { return compressed(r, T, 0); }});
        if (a.lowrank)
          configs.push_back({fmt::format("{} T={} lowrank r={}", r.label, T, a.lowrank),
                             [&compressed, &r, T, &a] { return compressed(r, T, a.lowrank); }});
      }
  }
  std::vector<Row> rows;
  for (int ctx : a.contexts)
    for (int B : cap ? std::vector<int>{0} : a.batches) {
      // Under a memory cap each configuration runs at its own largest batch (`batch` is then ignored).
      std::vector<Bench::Runs> runs;
      for (const Config& c : configs)
        runs.push_back(Bench::start(ctx, cap ? bench.fit_batch(ctx, c.make, cap) : B, c.label));
      for (int r = 0; r < a.repeat; ++r)
        for (size_t i = 0; i < configs.size(); ++i) bench.run_once(runs[i], configs[i].make);
      const Row full = bench.finish(runs[0], nullptr);
      for (size_t i = 0; i < runs.size(); ++i) {
        rows.push_back(i == 0 ? full : bench.finish(runs[i], &full));
        if (!json) table.row(rows.back());
      }
    }
  // The measurements first: a plot that cannot be written must not take them with it.
  if (json) fmt::print("{}\n", bench.json(rows).dump(2));
  std::fflush(stdout);
  if (!a.plot.empty()) {
    write_throughput_plot(throughput_plot(rows, bench.plot_title(), a.contexts.size() > 1), a.plot);
    fmt::print(stderr, "throughput against batch size: {}.png, .svg, .csv\n", a.plot);
  }
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "Prefill and decode speed against the hardware's measured limits");
  auto a = std::make_shared<BenchArgs>();
  cmd->add_option("model", a->model, "GGUF file or Hugging Face model directory")->required();
  cmd->add_option("--context,-c", a->contexts, "Context lengths (repeatable)");
  cmd->add_option("--repeat,-r", a->repeat, "Runs per context; medians are reported")->check(kPositive);
  cmd->add_option("--decode-tokens", a->decode_tokens, "Tokens decoded after each prefill (0: prefill only)")
      ->check(kNonNegative);
  cmd->add_option("--method", a->methods,
                  "Also decode with caches compressed by this method: NAME or NAME:key=value,... (repeatable; the "
                  "configurations take turns run by run, so their ratios come from the same stretch of time)");
  cmd->add_option("--budget", a->budgets, "KV sizes T for --method (repeatable)");
  cmd->add_option("--param", a->params, "Parameter key=value of every --method (repeatable)");
  cmd->add_option("--batch,-b", a->batches,
                  "Sequences decoding together, each with its own prompt and cache (repeatable; default 1)");
  cmd->add_option("--memory-cap", a->memory_cap_gib,
                  "GiB for weights, caches and decode buffers: each configuration decodes at the largest batch that "
                  "fits (throughput at a memory cap; --batch is then ignored)")
      ->default_str("none")
      ->each([a](const std::string&) { a->memory_cap_given = true; });
  cmd->add_option("--plot", a->plot,
                  "Also write decode tokens/s against batch size per configuration as STEM.png, .svg and .csv");
  cmd->add_option("--lowrank", a->lowrank, "Also store the method's kept tokens as rank-r low-rank segments")
      ->default_str("none");
  cmd->add_option("--format", a->format, "md, csv or json")->check(CLI::IsMember({"md", "csv", "json"}));
  add_engine_options(cmd, *a);
  cmd->callback([a] { run_bench(*a); });
}

}  // namespace kvb::cli
