#pragma once
// The sweep behind `kvbench run`: the model is loaded once, every sample of the task is prefilled
// once with full attention and that prefill serves each method x budget cell of the sample (methods
// that change prefill themselves get their own). Samples run in the order of their prompts, so that
// a prefix several prompts share is prefilled once (SharedPrefills). Cells have stable keys; those already recorded are
// skipped, the rest are appended one by one (synced), so a killed sweep resumes where it stopped. A
// cell that fails is logged beside the results (`<out>.failed`) and retried by the next run.
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "harness/experiment/experiment.hpp"
#include "harness/task/task.hpp"

namespace kvb {

class Method;

// Shard i of N holds the cells of every N-th sample (counted over the task variants), starting at
// the i-th: a sample's cells stay together so that its shared prefill is done once, and samples of
// every length are spread evenly over the shards.
struct SweepShard {
  int index = 0, count = 1;
};
// Parses "i/N" (0 <= i < N).
SweepShard parse_shard(const std::string& text);

struct SweepOutcome {
  size_t run = 0, already = 0;  // cells run now, cells found recorded
  // Cells that stopped with an error (a method refusing its input, a Python method raising): each is
  // logged to `failures` (one JSON line: key, id, config, error) and left unrecorded, so that a rerun
  // tries it again; the sweep goes on with the other cells.
  size_t failed = 0;
  std::string failures;
  double seconds = 0, prefill_seconds = 0;
  // Prompt tokens of the shared prefills, and how many of them were computed (the rest continued a
  // prefix another prompt had computed).
  size_t prompt_tokens = 0, prefilled_tokens = 0;
};

class Sweep {
 public:
  Sweep(const ExperimentSpec& spec, SweepShard shard = {});
  ~Sweep();
  // The expanded cells and the work they need, without running anything.
  void describe() const;
  // The keys of the cells of each of `count` shards, each key once, in the order of the samples.
  std::vector<std::vector<std::string>> cells_by_shard(int count) const;
  SweepOutcome run(bool progress = true);

 private:
  bool in_shard(const std::string& key) const;

  // One task variant (a combination of list-valued task options) with its samples and the cell
  // configurations, one per method configuration of the spec.
  struct Part {
    std::unique_ptr<Task> task;
    std::vector<Sample> samples;
    std::vector<size_t> prompt_tokens;           // of each sample, as the model sees it (chat template included)
    std::vector<std::vector<int32_t>> prefills;  // of each sample: the ids its shared prefill reads
    // Of each sample: a digest of every id the model reads, recorded with its cells, so that a resumed run
    // knows a recorded cell was made from the same prompt (the same data and tokenizer).
    std::vector<std::string> prompt_digests;
    std::vector<nlohmann::json> configs;
  };

  ExperimentSpec spec_;
  SweepShard shard_;
  std::set<std::string> shard_keys_;
  std::unique_ptr<ModelFile> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::unique_ptr<Method>> methods_;  // null for the full cache
  std::vector<Part> parts_;
};

}  // namespace kvb
