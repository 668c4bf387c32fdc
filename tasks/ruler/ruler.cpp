#include "tasks/ruler/ruler.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include <cmath>
#include <fstream>

#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {

std::vector<std::string> read_word_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: not found (scripts/setup.sh fetches the wonderwords word lists; or set KVBENCH_DATA)", path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) {
    while (!l.empty() && std::isspace(static_cast<unsigned char>(l.back()))) l.pop_back();
    out.push_back(l);
  }
  if (out.empty()) fail("{}: empty word list", path);
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

RulerTask::RulerTask(const TaskContext& ctx, const Params& p, int tokens_to_generate)
    : tok_(*ctx.tokenizer),
      name_(p.get("task")),
      length_(p.integer("length")),
      gen_(tokens_to_generate),
      n_samples_(static_cast<size_t>(p.get_int("samples"))),
      seed_(static_cast<uint64_t>(p.get_int("seed"))),
      rng_(seed_),
      protocol_(protocol_from(p)) {}

namespace {

// kvpress's split of a RULER input (evaluation/benchmarks/ruler/create_huggingface_dataset.py at
// 91773cb): the question starts at the last match of the task family's question pattern, the answer
// prefix at the first match of its answer pattern after that.
PromptSplit kvpress_ruler_split(const std::string& task, const std::string& input) {
  const std::string family = task.substr(0, task.find('_'));
  size_t q = std::string::npos;
  std::string answer = "Answer:";
  if (family == "niah") {
    for (const char* pattern : {"What is the special magic", "What are all the special magic"})
      if (const size_t at = input.rfind(pattern); at != std::string::npos && (q == std::string::npos || at > q)) q = at;
    answer = "The special magic";
  } else {
    static const std::map<std::string, std::string> question = {
        {"vt", "Question: Find all variables that are assigned the value"},
        {"cwe", "Question: What are the 10 most common words in the above list?"},
        {"fwe", "Question: Do not provide any explanation."},
        {"qa", "Answer the question based on the given documents."}};
    q = input.rfind(question.at(family));
  }
  const size_t a = q == std::string::npos ? q : input.find(answer, q);
  if (a == std::string::npos)
    fail("ruler {}: the input has no question and answer prefix where kvpress's patterns look for them", task);
  return {input.substr(0, q), input.substr(q, a - q), input.substr(a)};
}

}  // namespace

Sample RulerTask::sample(size_t i) const {
  if (i >= samples_.size()) fail("ruler {}: sample {} of {}", name_, i, samples_.size());
  return samples_[i];
}

double RulerTask::score(const Sample& s, const std::string& prediction) const {
  return ruler_string_match(prediction, s.answers, part_);
}

int RulerTask::count(const std::string& text) const { return static_cast<int>(tok_.encode(text).size()); }

void RulerTask::add(Built b, nlohmann::json meta) {
  Sample s;
  s.id = fmt::format("{}_{}_{}", name_, length_, samples_.size());
  s.prompt = std::move(b.input);
  s.answers = std::move(b.answers);
  s.max_new_tokens = gen_;  // kvpress's RULER limits are RULER's own
  if (protocol_.name != "native") {
    PromptSplit parts = kvpress_ruler_split(name_, s.prompt);
    apply_protocol(s, protocol_, std::move(parts.context), std::move(parts.question), std::move(parts.answer_prefix));
  }
  meta["task"] = name_;
  meta["length"] = b.tokens + gen_;
  meta["target_length"] = length_;
  s.meta = std::move(meta);
  samples_.push_back(std::move(s));
}

std::vector<RulerTask::Fitted> RulerTask::fit(const Sizing& z, size_t n, const std::function<Built(int)>& build,
                                              const std::function<void(Built&)>& finish) const {
  return fit(
      z, n, [&](int units, size_t) { return build(units); }, finish);
}

std::vector<RulerTask::Fitted> RulerTask::fit(const Sizing& z, size_t n, const std::function<Built(int, size_t)>& build,
                                              const std::function<void(Built&)>& finish) const {
  auto built = [&](int units) {
    Built b = build(units, 0);
    // Upstream raises inside its size search where a per-sample build would merely retry.
    if (!b.ok) fail("ruler {}: RULER's generator aborts here (name collision while sizing); try another seed", name_);
    return b;
  };
  const double per_unit = double(built(z.estimate_units).tokens) / z.estimate_units;
  const int upper = z.floor_times_two ? static_cast<int>(std::floor(z.length / per_unit)) * 2
                                      : static_cast<int>(z.length / per_unit * 3);
  int lo = z.inc, hi = std::max(upper, 2 * z.inc), best = 0;
  while (lo <= hi) {
    const int mid = (lo + hi) / 2;
    if (built(mid).tokens + z.extra + z.gen <= z.length) {
      best = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  best = best ? best : z.inc;
  std::vector<Fitted> out;
  for (size_t i = 0; i < n; ++i) {
    int units = best;
    for (int attempt = 0;; ++attempt) {
      Built b = build(units, i);
      if (b.ok && finish) finish(b);
      if (b.ok && b.tokens + z.gen <= z.length) {
        out.push_back({std::move(b), units});
        break;
      }
      // Upstream retries forever at the smallest size; a bound turns that into an error.
      if (units > z.inc)
        units -= z.inc;
      else if (attempt > 1000)
        fail(
            "ruler {}: length {}: even its smallest input ({} units: {} tokens, and {} to generate) does not fit; "
            "raise the task option length",
            name_, z.length, units, b.ok ? fmt::format("{}", b.tokens) : std::string("no valid sample"), z.gen);
    }
  }
  return out;
}

namespace {

// Tokens to generate per task (RULER's constants.py).
int tokens_to_generate(const std::string& task) {
  if (task.rfind("niah", 0) == 0) return 128;
  if (task == "vt") return 30;
  if (task == "cwe") return 120;
  if (task == "fwe") return 50;
  return 32;  // qa_1, qa_2
}

// Official RULER files: <dir>/<length>/<task>.jsonl (2024 layout, the answer prefix inside
// `input`, as KVCache-Factory ships them) or <dir>/<task>/validation.jsonl (2025, `answer_prefix`
// apart). The model input is input + answer_prefix either way.
class RulerFiles final : public RulerTask {
 public:
  RulerFiles(const TaskContext& ctx, const Params& p) : RulerTask(ctx, p, tokens_to_generate(p.get("task"))) {
    part_ = ruler_scores_any(name_);
    const std::string dir = p.get("dir");
    if (dir.empty()) fail("ruler: source=files needs dir=<directory of official RULER files>");
    const std::string a = fmt::format("{}/{}/{}.jsonl", dir, length_, name_),
                      b = fmt::format("{}/{}/validation.jsonl", dir, name_);
    const std::string path = std::ifstream(a) ? a : b;
    std::ifstream in(path);
    if (!in) fail("ruler: neither {} nor {} exists", a, b);
    for_each_json_line(in, path, [&](const nlohmann::json& j, int no) {
      if (!j.contains("input") || !j["input"].is_string()) fail("{}:{}: field 'input' must be a string", path, no);
      if (!j.contains("outputs") || !j["outputs"].is_array() || j["outputs"].empty())
        fail("{}:{}: field 'outputs' must be a non-empty list of strings", path, no);
      Built r;
      r.input = j["input"].get<std::string>();
      if (j.contains("answer_prefix")) {
        if (!j["answer_prefix"].is_string()) fail("{}:{}: field 'answer_prefix' must be a string", path, no);
        r.input += j["answer_prefix"].get<std::string>();
      }
      for (const auto& o : j["outputs"]) {
        if (!o.is_string()) fail("{}:{}: field 'outputs' must be a list of strings", path, no);
        r.answers.push_back(o);
      }
      // The stored length (prompt tokens + generation budget) counted with the generating tokenizer.
      const int tokens = count(r.input);
      const bool stored = j.contains("length") && j["length"].is_number_integer();
      r.tokens = stored ? j["length"].get<int>() - gen_ : tokens;
      add(std::move(r), {{"source", path}, {"line", no}, {"prompt_tokens", tokens}});
      return samples_.size() < n_samples_;
    });
    if (samples_.empty()) fail("{}: no records", path);
  }
};

const std::map<std::string, std::function<std::unique_ptr<Task>(const TaskContext&, const Params&)>>& generators() {
  static const std::map<std::string, std::function<std::unique_ptr<Task>(const TaskContext&, const Params&)>> f = {
      {"niah_single_1", make_ruler_niah},
      {"niah_single_2", make_ruler_niah},
      {"niah_single_3", make_ruler_niah},
      {"niah_multikey_1", make_ruler_niah},
      {"niah_multikey_2", make_ruler_niah},
      {"niah_multikey_3", make_ruler_niah},
      {"niah_multivalue", make_ruler_niah},
      {"niah_multiquery", make_ruler_niah},
      {"vt", make_ruler_vt},
      {"cwe", make_ruler_cwe},
      {"fwe", make_ruler_fwe},
      {"qa_1", make_ruler_qa},
      {"qa_2", make_ruler_qa}};
  return f;
}

std::unique_ptr<Task> make_ruler(const TaskContext& ctx, const Params& p) {
  if (p.get("source") == "files") return std::make_unique<RulerFiles>(ctx, p);
  const auto g = generators().find(p.get("task"));
  if (g == generators().end())
    fail("ruler {}: no native generator; load RULER's own files with source=files dir=<directory>", p.get("task"));
  return g->second(ctx, p);
}

const std::vector<std::string> kTasks = {"niah_single_1",
                                         "niah_single_2",
                                         "niah_single_3",
                                         "niah_multikey_1",
                                         "niah_multikey_2",
                                         "niah_multikey_3",
                                         "niah_multivalue",
                                         "niah_multiquery",
                                         "vt",
                                         "cwe",
                                         "fwe",
                                         "qa_1",
                                         "qa_2"};

// A prediction made elsewhere, scored as RULER's evaluate.py scores the task (ruler/TASK).
double score_prediction(const PredictionToScore& p) {
  return ruler_string_match(p.prediction, p.answers, ruler_scores_any(p.variant));
}

const bool registered = register_task(
    {.name = "ruler",
     .summary = "RULER: the 13 tasks generated natively (qa from the user's SQuAD/HotpotQA files) or loaded from "
                "RULER's official files",
     .options = {ParamSpec::choice("task", "niah_single_1", kTasks, "RULER task"),
                 ParamSpec::integer("length", 4096, 256, 1048576,
                                    "sequence length: prompt tokens plus the generated ones"),
                 ParamSpec::integer("samples", 500, 1, 100000, "samples (RULER: 500)"),
                 ParamSpec::integer("seed", 42, 0, 2147483647, "random seed (RULER: 42)"),
                 ParamSpec::choice("source", "generate", {"generate", "files"},
                                   "generate natively, or load official RULER JSONL files from dir"),
                 ParamSpec::text("dir", "",
                                 "with source=files: <dir>/<length>/<task>.jsonl or <dir>/<task>/validation.jsonl"),
                 ParamSpec::text("qa_file", "",
                                 "qa_1: SQuAD 2.0 dev (dev-v2.0.json), qa_2: HotpotQA dev distractor "
                                 "(hotpot_dev_distractor_v1.json); default <data>/ruler/squad.json or hotpotqa.json"),
                 protocol_option(), max_context_option()},
     .make = make_ruler,
     .score_prediction = score_prediction,
     .score_variant_option = "task",
     // The papers' RULER tables: one per context length, the tasks in RULER's order.
     .layout = {.title = "RULER",
                .column_option = "task",
                .default_column = "niah_single_1",
                .columns = {{"niah_single_1", "S1"},
                            {"niah_single_2", "S2"},
                            {"niah_single_3", "S3"},
                            {"niah_multikey_1", "MK1"},
                            {"niah_multikey_2", "MK2"},
                            {"niah_multikey_3", "MK3"},
                            {"niah_multivalue", "MV"},
                            {"niah_multiquery", "MQ"},
                            {"vt", "VT"},
                            {"cwe", "CWE"},
                            {"fwe", "FWE"},
                            {"qa_1", "QA-1"},
                            {"qa_2", "QA-2"}},
                .note = "Scores x 100 (string_match_all; string_match_part for QA); Avg. over the tasks shown",
                .nulls = true,
                .length_option = "length",
                .length_default = "4096",
                .pooled_options = {"task", "length", "samples"}}});

}  // namespace
}  // namespace kvb
