#include "harness/task/task.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {

TaskRegistry& TaskRegistry::get() {
  static TaskRegistry r;
  return r;
}

void TaskRegistry::add(TaskInfo info) {
  if (tasks_.count(info.name)) fail("task '{}' is registered twice", info.name);
  tasks_.emplace(info.name, std::move(info));
}

const TaskInfo* TaskRegistry::find(const std::string& name) const {
  const auto it = tasks_.find(name);
  return it == tasks_.end() ? nullptr : &it->second;
}

const TaskInfo& TaskRegistry::info(const std::string& name) const {
  auto it = tasks_.find(name);
  if (it == tasks_.end()) {
    std::string known;
    for (const auto& [n, _] : tasks_) known += (known.empty() ? "" : ", ") + n;
    fail("unknown task '{}' (known: {})", name, known);
  }
  return it->second;
}

std::vector<std::string> TaskRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, _] : tasks_) out.push_back(n);
  return out;
}

std::unique_ptr<Task> TaskRegistry::create(const std::string& name, const TaskContext& ctx) const {
  const TaskInfo& ti = info(name);
  if (!ctx.tokenizer) fail("task '{}' needs the model's tokenizer", name);
  return ti.make(ctx, Params(ti.options, ctx.options, "task " + name));
}

std::map<std::string, std::string> TaskRegistry::canonical_options(
    const std::string& name, const std::map<std::string, std::string>& given) const {
  const Params read(info(name).options, given, "task " + name);
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : given) out[k] = read.values().at(k);
  return out;
}

bool register_task(TaskInfo info) {
  TaskRegistry::get().add(std::move(info));
  return true;
}

std::string default_data_dir() {
  if (const char* d = std::getenv("KVBENCH_DATA")) return d;
  return std::string(KVBENCH_SOURCE_DIR) + "/data";
}

Essays read_essays(const std::string& data_dir, const std::string& task) {
  namespace fs = std::filesystem;
  const std::string dir = data_dir + "/PaulGrahamEssays";
  if (!fs::is_directory(dir))
    fail(
        "task {}: haystack directory {} not found (scripts/setup.sh fetches the Paul Graham essays; or set "
        "KVBENCH_DATA to a directory holding PaulGrahamEssays/*.txt)",
        task, dir);
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".txt") paths.push_back(e.path());
  if (paths.empty()) fail("task {}: {} holds no .txt essays", task, dir);
  std::sort(paths.begin(), paths.end());
  Essays out;
  out.files = static_cast<int>(paths.size());
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    if (!in) fail("task {}: cannot read {}", task, p.string());
    std::stringstream ss;
    ss << in.rdbuf();
    out.text += ss.str();
  }
  return out;
}

namespace {
std::pair<const TaskInfo*, std::string> scorer_of(const std::string& task_variant) {
  const size_t slash = task_variant.find('/');
  const std::string task = task_variant.substr(0, slash);
  const auto& reg = TaskRegistry::get();
  const TaskInfo& info = reg.info(task);
  if (!info.score_prediction) {
    std::vector<std::string> can;
    for (const auto& n : reg.names())
      if (reg.info(n).score_prediction) can.push_back(n);
    fail("score {}: task {} scores only the samples it makes (tasks that score predictions made elsewhere: {})",
         task_variant, task, fmt::join(can, ", "));
  }
  const std::string variant = slash == std::string::npos ? "" : task_variant.substr(slash + 1);
  if (info.score_variant_option.empty()) {
    if (slash != std::string::npos)
      fail("score {}: task {} takes no variant; give --task {}", task_variant, task, task);
    return {&info, variant};
  }
  const auto spec = std::find_if(info.options.begin(), info.options.end(),
                                 [&](const ParamSpec& s) { return s.name == info.score_variant_option; });
  if (spec == info.options.end()) fail("task {}: no option '{}' names its variants", task, info.score_variant_option);
  if (std::find(spec->choices.begin(), spec->choices.end(), variant) == spec->choices.end())
    fail("score {}: {}; name the {} after the slash, e.g. {}/{} ({}s: {})", task_variant,
         variant.empty() ? "no variant given" : fmt::format("unknown {} '{}'", spec->name, variant), spec->name, task,
         spec->choices.front(), spec->name, fmt::join(spec->choices, ", "));
  return {&info, variant};
}
}  // namespace

namespace {
// numpy's pairwise summation of float64 (add.reduce over a contiguous array): 8 running sums in blocks
// of up to 128, halves above that.
double numpy_pairwise_sum(std::span<const double> a) {
  const size_t n = a.size();
  if (n < 8) {
    double s = 0.;
    for (double v : a) s += v;
    return s;
  }
  if (n <= 128) {
    double r[8];
    for (size_t j = 0; j < 8; ++j) r[j] = a[j];
    size_t i = 8;
    for (; i < n - n % 8; i += 8)
      for (size_t j = 0; j < 8; ++j) r[j] += a[i + j];
    double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) s += a[i];
    return s;
  }
  size_t half = n / 2;
  half -= half % 8;
  return numpy_pairwise_sum(a.first(half)) + numpy_pairwise_sum(a.subspan(half));
}
}  // namespace

double benchmark_percent(std::span<const double> scores, PercentRule rule) {
  if (scores.empty()) return std::nan("");
  const double n = double(scores.size());
  if (rule == PercentRule::NumpyMean) return 100 * (numpy_pairwise_sum(scores) / n);
  double sum = 0;
  for (double v : scores) sum += v;
  return rule == PercentRule::HundredTimesSum ? 100.0 * sum / n : sum / n * 100.0;
}

double score_prediction(const std::string& task_variant, PredictionToScore p) {
  const auto [info, variant] = scorer_of(task_variant);
  p.variant = variant;
  return info->score_prediction(p);
}

PredictionScores score_predictions_file(const std::string& task_variant, const std::string& path, bool by_length,
                                        const std::string& data_dir) {
  const auto [info, variant] = scorer_of(task_variant);
  std::ifstream in(path);
  if (!in) fail("{}: cannot read the predictions file", path);
  const char* names[] = {"0-4k", "4-8k", "8k+"};
  std::vector<double> all, range[3];
  PredictionScores r;
  for_each_json_line(in, path, [&](const nlohmann::json& j, int no) {
    auto field = [&](const char* key, auto check, const char* expected) -> const nlohmann::json& {
      if (!j.is_object() || !j.contains(key)) fail("{}:{}: field '{}' is missing ({})", path, no, key, expected);
      if (!check(j[key])) fail("{}:{}: field '{}' is not {}", path, no, key, expected);
      return j[key];
    };
    auto is_strings = [](const nlohmann::json& v) {
      return v.is_array() && std::all_of(v.begin(), v.end(), [](const auto& x) { return x.is_string(); });
    };
    PredictionToScore p{.variant = variant, .data_dir = data_dir};
    p.prediction = field(
                       "pred", [](const auto& v) { return v.is_string(); }, "a string")
                       .get<std::string>();
    p.answers = field("answers", is_strings, "a list of strings").get<std::vector<std::string>>();
    if (j.contains("all_classes") && !j["all_classes"].is_null())
      p.all_classes = field("all_classes", is_strings, "a list of strings or null").get<std::vector<std::string>>();
    double s = 0;
    try {
      s = info->score_prediction(p);
    } catch (const Error& e) {
      fail("{}:{}: {}", path, no, e.what());
    }
    all.push_back(s);
    ++r.lines;
    if (by_length) {
      const double len = field(
                             "length", [](const auto& v) { return v.is_number(); }, "a number")
                             .get<double>();
      const int k = len < 4000 ? 0 : len < 8000 ? 1 : 2;
      range[k].push_back(s);
    }
    return true;
  });
  if (r.lines == 0) fail("{}: no predictions", path);
  // The benchmark's own order of operations, then Python's round(x, 2): it rounds the double's exact
  // decimal value, an exact tie to even (3.125 -> 3.12, where std::round(312.5) gives 3.13), as printf's
  // %.2f does.
  auto pct = [](std::span<const double> s, PercentRule rule) {
    if (s.empty()) return std::nan("");
    char text[64];
    std::snprintf(text, sizeof text, "%.2f", benchmark_percent(s, rule));
    return std::strtod(text, nullptr);
  };
  r.score = pct(all, info->layout.percent);
  if (by_length)
    for (int k = 0; k < 3; ++k) r.ranges.emplace_back(names[k], pct(range[k], PercentRule::NumpyMean));
  return r;
}

ParamSpec protocol_option() {
  return ParamSpec::choice("protocol", "native", {"native", "kvpress", "kvpress-query-aware"},
                           "native: the benchmark's prompt compressed whole; kvpress: the context compressed, the "
                           "question and answer prefix after it (kvpress's pipeline, chat template on); "
                           "kvpress-query-aware: the question compressed with the context");
}

ParamSpec max_context_option() {
  return ParamSpec::integer("max_context", 0, 0, 100000000,
                            "protocol=kvpress*: keep the first N tokens of the prefill (chat template head + "
                            "context), kvpress's max_context_length; 0: no cut");
}

Protocol protocol_from(const Params& p) {
  Protocol out{p.get("protocol"), p.integer("max_context")};
  if (out.max_context > 0 && out.name == "native")
    fail(
        "task option max_context={} cuts the context under protocol=kvpress or kvpress-query-aware, not native (the "
        "task's own truncation options apply there)",
        out.max_context);
  return out;
}

void apply_protocol(Sample& s, const Protocol& protocol, std::string context, std::string question,
                    std::string answer_prefix) {
  if (protocol.name == "native") return;
  if (protocol.name != "kvpress" && protocol.name != "kvpress-query-aware")
    fail("protocol '{}': expected native, kvpress or kvpress-query-aware", protocol.name);
  if (protocol.name == "kvpress-query-aware") {  // kvpress's evaluate.py: context += question; question = ""
    context += question;
    question.clear();
  }
  s.prompt = context + question + answer_prefix;
  s.split = PromptSplit{std::move(context), std::move(question), std::move(answer_prefix), protocol.max_context};
  s.chat = true;
  // kvpress's pipeline decodes greedily to max_new_tokens or the end of generation: no stop strings,
  // no minimum.
  s.stop.clear();
  s.end_texts.clear();
  s.min_new_tokens = 0;
}

}  // namespace kvb
