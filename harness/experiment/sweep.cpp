#include "harness/experiment/sweep.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <span>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/published.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/shared_prefills.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"

namespace kvb {

SweepShard parse_shard(const std::string& text) {
  SweepShard s;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%d/%d%c", &s.index, &s.count, &tail) != 2 || s.count < 1 || s.index < 0 ||
      s.index >= s.count)
    fail("--shard {}: expected i/N with 0 <= i < N", text);
  return s;
}

Sweep::Sweep(const ExperimentSpec& spec, SweepShard shard) : spec_(spec), shard_(shard) {
  model_ = ModelFile::open(spec.model);
  tok_ = load_tokenizer(*model_);
  // Method objects carry their parameters with defaults filled in; the configurations key the cells.
  for (const auto& c : spec.configs)
    methods_.push_back(c.name == "fullkv" ? nullptr : MethodRegistry::get().create(c.name, c.params, model_->config()));
  for (const auto& options : spec.task_variants) {
    Part p;
    TaskContext ctx;
    ctx.tokenizer = tok_.get();
    ctx.options = options;
    ctx.data_dir = spec.data;
    p.task = TaskRegistry::get().create(spec.task, ctx);
    const size_t n = spec.limit ? std::min(spec.limit, p.task->size()) : p.task->size();
    const int context = model_->config().context_length;
    for (size_t i = 0; i < n; ++i) {
      Sample s = p.task->sample(i);
      if (spec.max_new_tokens > 0) {
        s.max_new_tokens = std::min(s.max_new_tokens, spec.max_new_tokens);
        s.min_new_tokens = std::min(s.min_new_tokens, s.max_new_tokens);
      }
      // Before any cell runs: a table that needs more context than the model has is the wrong model
      // (or the wrong length option), not a list of failed cells hours later.
      const PromptIds ids = sample_prompt(*model_, *tok_, s);
      const size_t tokens = ids.prefill.size() + ids.after.size();
      if (tokens > size_t(context))
        fail(
            "{}: task {} with options {}: sample {} has a prompt of {} tokens, but the model {} has a context of {} "
            "tokens; this table needs a model with a longer context (or a smaller length option)",
            spec.path, spec.task, nlohmann::json(options).dump(), s.id, tokens, spec.model, context);
      p.prompt_tokens.push_back(tokens);
      p.prompt_digests.push_back(prompt_digest(ids));
      p.prefills.push_back(ids.prefill);
      p.samples.push_back(std::move(s));
    }
    // Before any cell runs: a KV size a method cannot hold (below its window) would fail every cell
    // after its prefill (MethodRunner refuses it); --dry-run says so too. (A compression ratio gives
    // each prompt its own T: a short prompt's below the window keeps part of the window.)
    for (size_t c = 0; c < spec.configs.size(); ++c) {
      const Method* m = methods_[c].get();
      const int T = spec.configs[c].budget.tokens;
      if (!m || T <= 0) continue;
      try {
        m->check_budget(T);
      } catch (const Error& e) {
        fail("{}: method {} at KV size {}: {}", spec.path, spec.configs[c].name, T, e.what());
      }
    }
    for (size_t c = 0; c < spec.configs.size(); ++c) {
      nlohmann::json config = cell_config(*model_, spec.model, spec.task, options, methods_[c].get(),
                                          spec.configs[c].budget, spec.kv_dtype, spec.weights);
      if (spec.max_new_tokens > 0) config["max_new_tokens"] = spec.max_new_tokens;
      p.configs.push_back(std::move(config));
    }
    parts_.push_back(std::move(p));
  }
  if (!spec.published.empty()) {
    std::vector<nlohmann::json> configs;
    std::vector<std::map<std::string, std::string>> variants;
    for (const auto& part : parts_) {
      configs.insert(configs.end(), part.configs.begin(), part.configs.end());
      variants.push_back(part.configs.front()["options"].get<std::map<std::string, std::string>>());
    }
    // A run that changes the table's methods, budgets or columns on purpose (a smoke run on a small
    // model) is checked for what it kept.
    PublishedChecks checks;
    checks.methods = !spec.overridden.count("methods");
    checks.budgets = !spec.overridden.count("budgets") && !spec.overridden.count("ratios");
    checks.columns = !spec.overridden.count("task_options");
    check_published(load_published(spec.published), std::filesystem::path(spec.path).stem().string(), spec.path,
                    spec.task, configs, variants, checks);
  }
  const auto mine = cells_by_shard(shard_.count)[size_t(shard_.index)];
  shard_keys_.insert(mine.begin(), mine.end());
}

Sweep::~Sweep() = default;

bool Sweep::in_shard(const std::string& key) const { return shard_keys_.count(key) > 0; }

std::vector<std::vector<std::string>> Sweep::cells_by_shard(int count) const {
  std::vector<std::vector<std::string>> shards(static_cast<size_t>(count));
  std::set<std::string> seen;
  size_t sample = 0;
  for (const auto& part : parts_)
    for (const auto& s : part.samples) {
      auto& into = shards[sample++ % size_t(count)];
      for (const auto& c : part.configs)
        if (std::string key = cell_key(c, s.id); seen.insert(key).second) into.push_back(std::move(key));
    }
  return shards;
}

void Sweep::describe() const {
  size_t cells = 0, tokens = 0, gen = 0, samples = 0;
  std::set<std::string> seen;
  for (const auto& part : parts_) {
    samples += part.samples.size();
    for (size_t i = 0; i < part.samples.size(); ++i) {
      const Sample& s = part.samples[i];
      const size_t p = part.prompt_tokens[i];
      for (const auto& c : part.configs)
        if (const std::string key = cell_key(c, s.id); in_shard(key) && seen.insert(key).second) {
          ++cells;
          tokens += p;
          gen += size_t(s.max_new_tokens);
        }
    }
  }
  fmt::print("{}: task {} ({} variants, {} samples) x {} method configurations, KV cache stored as {}{}:\n", spec_.path,
             spec_.task, parts_.size(), samples, spec_.configs.size(), kv_dtype_name(spec_.kv_dtype),
             spec_.weights ? fmt::format(", {} weights", weight_format_name(*spec_.weights)) : "");
  for (const auto& part : parts_) fmt::print("  task options {}\n", part.configs.front()["options"].dump());
  for (const auto& c : parts_.front().configs)
    fmt::print("  {} {} gqa {} params {}\n", c["method"].get<std::string>(),
               c.contains("compression_ratio")
                   ? fmt::format("compression ratio {}", c["compression_ratio"].get<double>())
               : c["budget"].get<int>() > 0 ? fmt::format("KV size {}", c["budget"].get<int>())
                                            : std::string("no budget"),
               c["gqa"].get<std::string>(), c["params"].dump());
  fmt::print("{} cells{}: {} prompt tokens to prefill, up to {} tokens to generate; results in {}\n", cells,
             shard_.count > 1 ? fmt::format(" in shard {}/{}", shard_.index, shard_.count) : "", tokens, gen,
             spec_.out);
}

SweepOutcome Sweep::run(bool progress) {
  Engine engine(
      *model_,
      {.backend = spec_.backend, .threads = spec_.threads, .kv_dtype = spec_.kv_dtype, .weights = spec_.weights});
  if (spec_.batch > 1 && !engine.backend().decodes_batches())
    fail("{}: batch {}: the {} backend decodes one sequence at a time; set batch: 1", spec_.path, spec_.batch,
         engine.backend().name());
  ResultsFile out(spec_.out);  // first: opening cuts a torn last line
  // The cells recorded already, each made from the prompt this run would give it.
  const std::map<std::string, RecordedCell> recorded = recorded_cells(spec_.out);
  std::set<std::string> done;
  for (const auto& part : parts_)
    for (size_t si = 0; si < part.samples.size(); ++si)
      for (const auto& c : part.configs)
        if (const std::string key = cell_key(c, part.samples[si].id);
            in_shard(key) &&
            recorded_with_prompt(recorded, key, part.samples[si].id, part.prompt_digests[si], spec_.out, spec_.data))
          done.insert(key);
  SweepOutcome o;
  o.already = done.size();
  o.failures = spec_.out + ".failed";
  std::unique_ptr<ResultsFile> failures;  // opened at the first failure
  // Two entries of a spec that resolve to the same configuration are one cell, run once.
  std::set<std::string> pending;
  for (const auto& part : parts_)
    for (const auto& s : part.samples)
      for (const auto& c : part.configs)
        if (const std::string key = cell_key(c, s.id); in_shard(key) && !done.count(key)) pending.insert(key);
  // Variants differing only in how a text is scored share a generation (TaskInfo::scoring_options): the
  // records of the others, in the file or made now, by the key their cell has without those options.
  const auto& scoring = TaskRegistry::get().info(spec_.task).scoring_options;
  auto generation_key = [&](nlohmann::json config, const std::string& id) {
    config.erase("version");
    for (const auto& k : scoring) config["options"].erase(k);
    return cell_key(config, id);
  };
  std::map<std::string, std::pair<nlohmann::json, int>> generations;  // record, line (0: made now)
  if (!scoring.empty() && std::filesystem::exists(spec_.out))
    for_each_record(spec_.out, [&](const nlohmann::json& j, int line) {
      if (j.contains("prediction") && j.contains("id") && j["config"].contains("options"))
        generations.emplace(generation_key(j["config"], j["id"].get<std::string>()), std::pair{j, line});
    });
  const size_t todo = pending.size();
  if (progress)
    fmt::print(stderr, "{}: {} cells to run ({} already recorded in {})\n", spec_.name, todo, done.size(), spec_.out);
  std::unique_ptr<Progress> bar = progress ? std::make_unique<Progress>(spec_.name, todo, "cells") : nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  // A sample's cells: those that read one shared prefill of its prompt, and those that run their own.
  struct Work {
    const Part* part;
    size_t sample;
    std::vector<size_t> shared, own;
  };
  std::vector<Work> work;
  for (const auto& part : parts_)
    for (size_t si = 0; si < part.samples.size(); ++si) {
      const Sample& s = part.samples[si];
      Work w{&part, si, {}, {}};
      for (size_t c = 0; c < part.configs.size(); ++c) {
        const std::string key = cell_key(part.configs[c], s.id);
        if (!in_shard(key) || !done.insert(key).second) continue;
        // Multiple-choice and perplexity samples run their own prefills: nothing to share across methods.
        (s.choices || s.scored_text || (methods_[c] && !methods_[c]->shares_prefill()) ? w.own : w.shared).push_back(c);
      }
      if (!w.shared.empty() || !w.own.empty()) work.push_back(std::move(w));
    }
  // Samples in the order of their prompts; one set of needs (what the most demanding method reads) makes
  // every capture a prefix for any later prompt. Equal prompts stay in variant order, so a variant that
  // only scores differently comes after the one whose generation it re-scores.
  std::vector<std::span<const int32_t>> prompts;
  for (const Work& w : work) prompts.emplace_back(w.part->prefills[w.sample]);
  const std::vector<size_t> order = SharedPrefills::order(prompts);
  PrefillNeeds needs;
  std::vector<std::span<const int32_t>> shared_prompts;
  for (size_t i : order)
    if (!work[i].shared.empty()) {
      shared_prompts.push_back(prompts[i]);
      for (size_t c : work[i].shared)
        if (methods_[c]) needs.merge(methods_[c]->needs());
    }
  SharedPrefills prefills(engine, needs, std::move(shared_prompts), SharedPrefills::default_max_bytes());
  // Methods that make their own weights (Atom) run after the others, one set of weights at a time over all
  // samples: the engine keeps one set, which each change of weights makes again, and cells decoding
  // together must share the weights each step reads.
  auto weights_of = [&](size_t c) {
    const LinearTransform* t = methods_[c] ? methods_[c]->linear_transform() : nullptr;
    return t ? t->weights_key() : std::string();
  };
  std::set<std::string> passes = {""};
  for (const Work& w : work)
    for (size_t c : w.own) passes.insert(weights_of(c));
  for (const std::string& pass : passes)
    for (size_t i : order) {
      const Part& part = *work[i].part;
      const Sample& s = part.samples[work[i].sample];
      // A cell whose generation is recorded under other scoring options is re-scored, not run.
      auto rescored = [&](size_t c) {
        if (scoring.empty()) return false;
        const auto it = generations.find(generation_key(part.configs[c], s.id));
        if (it == generations.end()) return false;
        const auto& [from, line] = it->second;
        // Another prompt's generation is no answer to this one (another data directory, same sample id).
        if (const std::string digest = from.value("prompt_digest", std::string());
            !digest.empty() && digest != part.prompt_digests[work[i].sample])
          fail(
              "{}:{}: sample {} was generated from another prompt (digest {}, now {}) and cannot be scored again for "
              "this one: the data ({}), the task's files or the tokenizer changed since; write to another --out",
              spec_.out, line, s.id, digest, part.prompt_digests[work[i].sample], spec_.data);
        const auto t = std::chrono::steady_clock::now();
        nlohmann::json rec = from;
        rec.update({{"key", cell_key(part.configs[c], s.id)},
                    {"version", code_version()},
                    {"config", part.configs[c]},
                    {"meta", s.meta},
                    {"score", part.task->score(s, rec["prediction"].get<std::string>())},
                    {"scored_from", from.value("key", std::string())},
                    {"prompt_digest", part.prompt_digests[work[i].sample]}});
        rec["wall_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        out.append(rec);
        ++o.run;
        if (bar) bar->advance(1, fmt::format("rescored {:.2f}", rec["score"].get<double>()));
        return true;
      };
      std::vector<size_t> shared, own;
      for (size_t c : work[i].shared)
        if (pass.empty() && !rescored(c)) shared.push_back(c);
      for (size_t c : work[i].own)
        if (weights_of(c) == pass && !rescored(c)) own.push_back(c);
      // What a cell costs, its share of a shared prefill included: the rate status estimates from.
      double prefill_share = 0;
      auto failed = [&](size_t c, const std::string& error) {
        const std::string& method = part.configs[c]["method"].get_ref<const std::string&>();
        if (!failures) failures = std::make_unique<ResultsFile>(o.failures);
        failures->append({{"key", cell_key(part.configs[c], s.id)},
                          {"id", s.id},
                          {"version", code_version()},
                          {"config", part.configs[c]},
                          {"error", error}});
        ++o.failed;
        fmt::print(stderr, "\n{}: cell {} of sample {} failed: {}\n", spec_.name, method, s.id, error);
        if (bar) bar->advance(1, fmt::format("{} failed", method));
      };
      auto save = [&](size_t c, nlohmann::json rec, double seconds) {
        rec["wall_seconds"] = seconds;
        rec["prompt_digest"] = part.prompt_digests[work[i].sample];
        out.append(rec);
        if (!scoring.empty()) generations.emplace(generation_key(part.configs[c], s.id), std::pair{rec, 0});
        ++o.run;
        if (bar)
          bar->advance(
              1, fmt::format("{} {:.2f}", part.configs[c]["method"].get<std::string>(), rec["score"].get<double>()));
      };
      // One at a time, or (batch > 1, a generation sample) in groups that decode together.
      auto run_group = [&](const std::vector<size_t>& cells, const PrefillCapture* capture) {
        const double share = capture ? prefill_share : 0.0;
        if (spec_.batch <= 1 || s.choices || s.scored_text) {
          for (size_t c : cells) {
            const auto t = std::chrono::steady_clock::now();
            nlohmann::json rec;
            try {
              rec = run_cell(*model_, *tok_, engine, *part.task, s, methods_[c].get(), spec_.configs[c].budget,
                             part.configs[c], capture);
            } catch (const Error& e) {
              failed(c, e.what());
              continue;
            }
            save(c, std::move(rec),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() + share);
          }
          return;
        }
        for (size_t from = 0; from < cells.size(); from += size_t(spec_.batch)) {
          const std::span<const size_t> group =
              std::span(cells).subspan(from, std::min(cells.size() - from, size_t(spec_.batch)));
          std::vector<CellRun> runs;
          for (size_t c : group) runs.push_back({methods_[c].get(), spec_.configs[c].budget, &part.configs[c]});
          std::vector<CellOutcome> outcomes = run_cells(*model_, *tok_, engine, *part.task, s, runs, capture);
          for (size_t j = 0; j < group.size(); ++j) {
            if (!outcomes[j].error.empty())
              failed(group[j], outcomes[j].error);
            else
              save(group[j], std::move(outcomes[j].record), outcomes[j].seconds + share);
          }
        }
      };
      if (!shared.empty()) {
        const auto t = std::chrono::steady_clock::now();
        const std::shared_ptr<const PrefillCapture> capture = prefills.next();
        const double prefill = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        o.prefill_seconds += prefill;
        prefill_share = prefill / double(shared.size());
        run_group(shared, capture.get());
      } else if (pass.empty() && !work[i].shared.empty()) {
        prefills.skip();
      }
      run_group(own, nullptr);
    }
  o.prompt_tokens = prefills.tokens_total();
  o.prefilled_tokens = prefills.tokens_prefilled();
  if (bar) bar->finish();
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

}  // namespace kvb
