#pragma once
// RULER's synthetic tasks (NVIDIA/RULER's scripts/data/synthetic/), generated natively with the 2025 code's
// behaviour: Python-compatible randomness replayed call for call (every candidate build consumes the
// stream, as upstream), inputs sized to a target token length with the model's own tokenizer, and
// RULER's scoring. Each family (niah, vt, cwe, fwe, qa) derives from RulerTask in its own file.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/task/py_random.hpp"
#include "harness/task/string_match.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/util/params.hpp"

namespace kvb {

// A word list file of the wonderwords package, as `_get_words_from_text_file` reads it (lines with
// trailing whitespace removed).
std::vector<std::string> read_word_list(const std::string& path);
// Python's str.replace (every non-overlapping occurrence, left to right).
std::string replace_all(std::string s, const std::string& from, const std::string& to);

// Whether a RULER task scores with string_match_part (the QA tasks) rather than string_match_all.
inline bool ruler_scores_any(const std::string& task) { return task.rfind("qa", 0) == 0; }

class RulerTask : public Task {
 public:
  RulerTask(const TaskContext& ctx, const Params& p, int tokens_to_generate);

  size_t size() const override { return samples_.size(); }
  Sample sample(size_t index) const override;
  // string_match_all (string_match_part for qa) on RULER's post-processed prediction.
  double score(const Sample& s, const std::string& prediction) const override;

 protected:
  struct Built {
    std::string input;  // template, answer prefix included
    std::vector<std::string> answers;
    int tokens = 0;
    bool ok = true;  // false where upstream's build raises (the per-sample loop then shrinks)
  };
  // The 2025 sizing: `estimate_units` units give tokens per unit t; the upper bound is
  // int(L / t * 3) (or int(L // t) * 2 with `floor_times_two`); a binary search finds the most units
  // whose input fits L with `gen` generated and `extra` other tokens (vt's example); then each of `n`
  // samples is built at that size, shrinking by `inc` while a fresh draw does not fit. `finish`
  // completes a per-sample build (vt inserts its example).
  struct Sizing {
    int length = 0, gen = 0, inc = 0, estimate_units = 0, extra = 0;
    bool floor_times_two = false;
  };
  struct Fitted {
    Built built;
    int units = 0;
  };
  std::vector<Fitted> fit(const Sizing& z, size_t n, const std::function<Built(int units)>& build,
                          const std::function<void(Built&)>& finish = {}) const;
  // The same where a build depends on the sample being made (qa draws sample i's question; the size
  // search uses sample 0's).
  std::vector<Fitted> fit(const Sizing& z, size_t n, const std::function<Built(int units, size_t sample)>& build,
                          const std::function<void(Built&)>& finish = {}) const;
  // Adds a sample (input, answers, length = its tokens + the generated ones).
  void add(Built b, nlohmann::json meta);
  int count(const std::string& text) const;

  const Tokenizer& tok_;
  std::string name_;
  int length_, gen_;
  size_t n_samples_;
  uint64_t seed_;
  PyRandom rng_;
  bool part_ = false;
  Protocol protocol_;
  std::vector<Sample> samples_;
};

std::unique_ptr<Task> make_ruler_niah(const TaskContext& ctx, const Params& p);
std::unique_ptr<Task> make_ruler_vt(const TaskContext& ctx, const Params& p);
std::unique_ptr<Task> make_ruler_cwe(const TaskContext& ctx, const Params& p);
std::unique_ptr<Task> make_ruler_fwe(const TaskContext& ctx, const Params& p);
std::unique_ptr<Task> make_ruler_qa(const TaskContext& ctx, const Params& p);

}  // namespace kvb
