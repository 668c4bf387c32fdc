// RULER's variable tracking (vt, scripts/data/synthetic/variable_tracking.py): one chain of 4 hops hidden in the noise
// haystack, with the 2025 code's in-context example (sized alone to 500 tokens, then re-randomised in
// every build of a real sample) and numpy's legacy generator for the chain values.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "harness/task/text.hpp"
#include "tasks/ruler/ruler.hpp"

namespace kvb {
namespace {

constexpr const char* kTemplate =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above. Answer: According to "
    "the chain(s) of variable assignment in the text above, {num_v} variables are assigned the value {query}, "
    "they are: ";
constexpr const char* kNoiseLine =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
constexpr int kHops = 4;

class VariableTracking final : public RulerTask {
 public:
  VariableTracking(const TaskContext& ctx, const Params& p) : RulerTask(ctx, p, 30), np_(static_cast<uint32_t>(seed_)) {
    // The in-context example: 3-letter names, the value 12345, no tokens to generate, 500 tokens.
    const Built icl = fit({500, 0, 5, 5}, 1, [this](int n) { return build(n, true); }).front().built;
    std::string joined;
    for (const auto& a : icl.answers) joined += (joined.empty() ? "" : " ") + a;
    example_ = icl.input + " " + joined + "\n";
    const int inc = length_ >= 4096 ? 10 : 5;
    auto finish = [this](Built& b) {
      // Before the task template (the input's start with the base model wrapper).
      const size_t cutoff = b.input.find(std::string(kTemplate).substr(0, 20));
      b.input.insert(cutoff, randomized_example() + "\n");
      b.tokens = count(b.input);
    };
    for (auto& f : fit(
             {length_, gen_, inc, inc, count(example_)}, n_samples_, [this](int n) { return build(n, false); }, finish))
      add(std::move(f.built), {{"units", f.units}, {"haystack", "noise"}});
  }

 private:
  std::string letters(size_t k) {
    std::string s;
    for (size_t i = 0; i < k; ++i) s += static_cast<char>('A' + static_cast<int>(rng_.random() * 26));
    return s;
  }

  Built build(int noises, bool icl) {
    Built b;
    const size_t k = icl ? 3 : 5, names = kHops + 1;
    std::vector<std::string> vars;
    for (size_t i = 0; i < names; ++i) vars.push_back(letters(k));
    while (std::set<std::string>(vars.begin(), vars.end()).size() < names) vars.push_back(letters(k));
    // Upstream cuts the names into chains of hops + 1; after a collision the last one is short and
    // raises once its value has been drawn.
    std::vector<std::string> chain;
    for (size_t start = 0; start < vars.size(); start += names) {
      const std::string value = icl ? "12345" : std::to_string(np_.randint(10000, 99999));
      if (start + names > vars.size()) {
        b.ok = false;
        return b;
      }
      if (start == 0) {
        chain.push_back(fmt::format("VAR {} = {}", vars[0], value));
        for (int j = 0; j < kHops; ++j) chain.push_back(fmt::format("VAR {} = VAR {} ", vars[j + 1], vars[j]));
      }
    }
    std::vector<std::string> lines(static_cast<size_t>(noises), kNoiseLine);
    auto pos = rng_.sample(lines.size(), chain.size());
    std::sort(pos.begin(), pos.end());
    for (size_t j = 0; j < chain.size(); ++j)
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(pos[j] + j), chain[j]);
    std::string context;
    for (size_t i = 0; i < lines.size(); ++i) context += (i ? "\n" : "") + lines[i];
    context = replace_all(context, ". \n", ".\n");
    const std::string value = chain[0].substr(chain[0].rfind('=') + 2);
    b.input = fill_template(kTemplate, {{"context", context}, {"query", value}, {"num_v", std::to_string(kHops + 1)}});
    b.answers.assign(vars.begin(), vars.begin() + names);
    b.tokens = count(b.input);
    return b;
  }

  // The example with its answer names and value drawn afresh (plain substring replacement, as upstream).
  std::string randomized_example() {
    std::vector<std::string> words = python_split(example_);
    std::string ex = example_;
    for (size_t i = words.size() - (kHops + 1); i < words.size(); ++i)
      ex = replace_all(ex, words[i], letters(words[i].size()));
    return replace_all(ex, "12345", std::to_string(np_.randint(10000, 99999)));
  }

  NumpyRandom np_;
  std::string example_;
};

}  // namespace

std::unique_ptr<Task> make_ruler_vt(const TaskContext& ctx, const Params& p) {
  return std::make_unique<VariableTracking>(ctx, p);
}

}  // namespace kvb
