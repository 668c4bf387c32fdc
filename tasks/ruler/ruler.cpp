#include "tasks/ruler/ruler.hpp"

#include <fmt/format.h>

#include <cmath>
#include <fstream>

#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "tasks/text.hpp"

namespace kvb {

std::vector<std::string> read_word_list(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail("{}: not found (scripts/setup.sh fetches the wonderwords word lists; or set KVBENCH_DATA)", path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) {
    while (!l.empty() && std::isspace(static_cast<unsigned char>(l.back()))) l.pop_back();
    out.push_back(l);
  }
  if (out.empty()) fail("{}: empty word list", path);
  return out;
}

std::string fill_template(const std::string& t, const std::map<std::string, std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '{') {
      const size_t close = t.find('}', i);
      if (close == std::string::npos) fail("template: unclosed '{{' at {}", i);
      const auto f = fields.find(t.substr(i + 1, close - i - 1));
      if (f == fields.end()) fail("template: no value for field {}", t.substr(i, close - i + 1));
      out += f->second;
      i = close + 1;
    } else {
      out += t[i++];
    }
  }
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

RulerTask::RulerTask(const TaskContext& ctx, const Params& p, int tokens_to_generate)
    : tok_(*ctx.tokenizer), name_(p.get("task")), length_(static_cast<int>(p.get_int("length"))),
      gen_(tokens_to_generate), n_samples_(static_cast<size_t>(p.get_int("samples"))),
      seed_(static_cast<uint64_t>(p.get_int("seed"))), rng_(seed_) {}

Sample RulerTask::sample(size_t i) const {
  if (i >= samples_.size()) fail("ruler {}: sample {} of {}", name_, i, samples_.size());
  return samples_[i];
}

double ruler_string_match(const std::string& prediction, const std::vector<std::string>& references, bool part) {
  // evaluate.py: strip, control characters to newlines, strip again.
  std::string p = python_strip(prediction);
  for (char& c : p)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  p = python_lower(python_strip(p));
  double hits = 0, any = 0;
  for (const auto& r : references) {
    const double h = p.find(python_lower(r)) != std::string::npos ? 1.0 : 0.0;
    hits += h;
    any = std::max(any, h);
  }
  return part ? any : hits / double(references.size());
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
  s.max_new_tokens = gen_;
  meta["task"] = name_;
  meta["length"] = b.tokens + gen_;
  meta["target_length"] = length_;
  s.meta = std::move(meta);
  samples_.push_back(std::move(s));
}

std::vector<RulerTask::Fitted> RulerTask::fit(const Sizing& z, size_t n, const std::function<Built(int)>& build,
                                               const std::function<void(Built&)>& finish) const {
  auto built = [&](int units) {
    Built b = build(units);
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
      Built b = build(units);
      if (b.ok && finish) finish(b);
      if (b.ok && b.tokens + z.gen <= z.length) {
        out.push_back({std::move(b), units});
        break;
      }
      // Upstream retries forever at the smallest size; a bound turns that into an error.
      if (units > z.inc) units -= z.inc;
      else if (attempt > 1000) fail("ruler {}: no input of {} units fits {} tokens", name_, units, z.length);
    }
  }
  return out;
}

namespace {

const std::map<std::string, std::function<std::unique_ptr<Task>(const TaskContext&, const Params&)>>& families() {
  static const std::map<std::string, std::function<std::unique_ptr<Task>(const TaskContext&, const Params&)>> f = {
      {"niah_single_1", make_ruler_niah}, {"niah_multikey_2", make_ruler_niah}, {"niah_multikey_3", make_ruler_niah},
      {"vt", make_ruler_vt},          {"cwe", make_ruler_cwe},         {"fwe", make_ruler_fwe}};
  return f;
}

const bool registered = register_task(
    {"ruler",
     "RULER synthetic tasks (niah noise/needle variants, vt, cwe, fwe), generated natively",
     {ParamSpec::choice("task", "niah_single_1", {"niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"},
                        "RULER task"),
      ParamSpec::integer("length", 4096, 256, 1048576, "sequence length: prompt tokens plus the generated ones"),
      ParamSpec::integer("samples", 500, 1, 100000, "samples (RULER: 500)"),
      ParamSpec::integer("seed", 42, 0, 2147483647, "random seed (RULER: 42)")},
     [](const TaskContext& ctx, const Params& p) { return families().at(p.get("task"))(ctx, p); }});

}  // namespace
}  // namespace kvb
