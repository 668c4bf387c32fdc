#pragma once
// The sweep behind `kvbench run`: the model is loaded once, every sample of the task is prefilled
// once with full attention and that prefill serves each method x budget cell of the sample (methods
// that change prefill themselves get their own). Cells have stable keys; those already recorded are
// skipped, the rest are appended one by one (synced), so a killed sweep resumes where it stopped.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/experiment/experiment.hpp"
#include "tasks/task.hpp"

namespace kvb {

class Method;

struct SweepShard {
  int index = 0, count = 1;  // share `index` of `count`, by cell key
};
// Parses "i/N" (0 <= i < N).
SweepShard parse_shard(const std::string& text);

struct SweepOutcome {
  size_t run = 0, already = 0;  // cells run now, cells found recorded
  double seconds = 0, prefill_seconds = 0;
};

class Sweep {
 public:
  Sweep(const ExperimentSpec& spec, SweepShard shard = {});
  ~Sweep();
  // The expanded cells and the work they need, without running anything.
  void describe() const;
  SweepOutcome run(bool progress = true);

 private:
  bool in_shard(const std::string& key) const;

  // One task variant (a combination of list-valued task options) with its samples and the cell
  // configurations, one per method configuration of the spec.
  struct Part {
    std::unique_ptr<Task> task;
    std::vector<Sample> samples;
    std::vector<nlohmann::json> configs;
  };

  ExperimentSpec spec_;
  SweepShard shard_;
  std::unique_ptr<ModelFile> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<std::unique_ptr<Method>> methods_;  // null for the full cache
  std::vector<Part> parts_;
};

}  // namespace kvb
