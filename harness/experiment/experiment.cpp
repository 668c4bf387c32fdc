#include "harness/experiment/experiment.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kvbench/git_version.hpp"

namespace kvb {

const char* code_version() { return KVBENCH_GIT_VERSION; }

namespace {

// The nodes each --set override laid over the spec (its key, its value and the value's items): they have no
// place in the file, so an error about one names the override instead.
struct Override {
  std::string text;
  std::vector<YAML::Node> nodes;
};
thread_local const std::vector<Override>* current_overrides = nullptr;

void collect_nodes(const YAML::Node& n, std::vector<YAML::Node>& out) {
  out.push_back(n);
  if (n.IsMap())
    for (const auto& kv : n) {
      out.push_back(kv.first);
      collect_nodes(kv.second, out);
    }
  else if (n.IsSequence())
    for (const auto& item : n) collect_nodes(item, out);
}

// The last override that laid `n` or a node inside it (a method entry one of whose fields was set), or
// null; `laid` says whether an override laid `n` itself, which then has no place in the file.
const Override* override_of(const YAML::Node& n, bool& laid) {
  laid = false;
  if (!current_overrides) return nullptr;
  std::vector<YAML::Node> below;
  collect_nodes(n, below);
  const Override* last = nullptr;
  for (const Override& o : *current_overrides) {
    auto lays = [&](const YAML::Node& x) {
      return std::any_of(o.nodes.begin(), o.nodes.end(), [&](const YAML::Node& y) { return y.is(x); });
    };
    laid = laid || lays(n);
    if (std::any_of(below.begin(), below.end(), lays)) last = &o;
  }
  return last;
}

[[noreturn]] void spec_error(const std::string& path, const YAML::Node& n, const std::string& msg) {
  bool laid = false;
  const Override* o = override_of(n, laid);
  if (o && laid) fail("{}: --set {}: {}", path, o->text, msg);
  const auto m = n.Mark();
  const std::string with = o ? fmt::format(" (with --set {})", o->text) : "";
  if (m.is_null()) fail("{}{}: {}", path, with, msg);
  fail("{}:{}:{}{}: {}", path, m.line + 1, m.column + 1, with, msg);
}

// The items of an optional list of numbers, each read as T and checked by `valid`.
template <typename T, typename Valid>
std::vector<T> number_list(const std::string& path, const YAML::Node& node, const std::string& list_error,
                           const std::string& item_error, Valid valid) {
  std::vector<T> out;
  if (!node) return out;
  if (!node.IsSequence()) spec_error(path, node, list_error);
  for (const auto& item : node) {
    T v{};
    try {
      v = item.as<T>();
    } catch (const YAML::Exception&) {
      spec_error(path, item, item_error);
    }
    if (!valid(v)) spec_error(path, item, item_error);
    out.push_back(v);
  }
  return out;
}

std::string scalar(const std::string& path, const YAML::Node& n, const std::string& what) {
  if (!n.IsScalar()) spec_error(path, n, fmt::format("'{}' must be a single value", what));
  return n.Scalar();
}

std::map<std::string, std::string> scalar_map(const std::string& path, const YAML::Node& n, const std::string& what) {
  if (!n.IsMap()) spec_error(path, n, fmt::format("'{}' must be a mapping of names to values", what));
  std::map<std::string, std::string> out;
  for (const auto& kv : n) out[kv.first.Scalar()] = scalar(path, kv.second, what + "." + kv.first.Scalar());
  return out;
}

void check_keys(const std::string& path, const YAML::Node& n, const std::vector<std::string>& valid,
                const std::string& where) {
  for (const auto& kv : n) {
    const std::string k = kv.first.Scalar();
    if (std::find(valid.begin(), valid.end(), k) == valid.end()) {
      std::string list;
      for (const auto& v : valid) list += (list.empty() ? "" : ", ") + v;
      spec_error(path, kv.first, fmt::format("unknown key '{}' in {} (valid: {})", k, where, list));
    }
  }
}

// Every combination of the listed values over the parameters, on top of `base`.
std::vector<std::map<std::string, std::string>> expand_grid(
    const std::map<std::string, std::string>& base, const std::map<std::string, std::vector<std::string>>& grid) {
  std::vector<std::map<std::string, std::string>> combos = {base};
  for (const auto& [param, values] : grid) {
    std::vector<std::map<std::string, std::string>> next;
    for (const auto& c : combos)
      for (const auto& v : values) {
        auto d = c;
        d[param] = v;
        next.push_back(d);
      }
    combos = next;
  }
  return combos;
}

// Lays "a.b.c=value" over the spec (the value parsed as YAML), creating the mappings on the way; returns
// the nodes it laid.
Override apply_set(const std::string& path, YAML::Node& root, const std::string& set) {
  const auto eq = set.find('=');
  if (eq == std::string::npos || eq == 0)
    fail("{}: override '{}': expected KEY=VALUE (e.g. limit=1 or task_options.length=[4096])", path, set);
  YAML::Node value;
  try {
    value = YAML::Load(set.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    fail("{}: override '{}': the value is not YAML ({})", path, set, e.msg);
  }
  std::vector<std::string> keys;
  for (size_t start = 0, dot;; start = dot + 1) {
    dot = set.find('.', start);
    keys.push_back(set.substr(start, std::min(dot, eq) - start));
    if (dot == std::string::npos || dot > eq) break;
  }
  // yaml-cpp's operator[] on a node rebinds; walk with fresh handles so each level is the parent's child. In a
  // list a key is an index (methods.9.params.act_group_size=64).
  auto index_in = [&](const YAML::Node& list, const std::string& key) {
    const bool digits = !key.empty() && key.size() <= 9 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || std::stoul(key) >= list.size())
      fail("{}: override '{}': '{}' is not an index of the list's {} entries", path, set, key, list.size());
    return std::stoul(key);
  };
  std::vector<YAML::Node> chain = {root};
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    if (chain.back().IsSequence()) {
      chain.push_back(chain.back()[index_in(chain.back(), keys[i])]);
      if (!chain.back().IsMap() && !chain.back().IsSequence())
        fail(
            "{}: override '{}': entry {} of the list is '{}', not a mapping; replace it whole ({}={{name: ..., params: "
            "{{...}}}})",
            path, set, keys[i], YAML::Dump(chain.back()),
            fmt::format("{}", fmt::join(keys.begin(), keys.begin() + ptrdiff_t(i) + 1, ".")));
      continue;
    }
    YAML::Node next = chain.back()[keys[i]];
    if (next && !next.IsMap() && !next.IsSequence())
      fail("{}: override '{}': '{}' is neither a mapping nor a list", path, set, keys[i]);
    if (!next) chain.back()[keys[i]] = YAML::Node(YAML::NodeType::Map);
    chain.push_back(chain.back()[keys[i]]);
  }
  Override laid{set, {}};
  if (chain.back().IsSequence()) {
    chain.back()[index_in(chain.back(), keys.back())] = value;
  } else {
    chain.back()[keys.back()] = value;
    for (const auto& kv : chain.back())
      if (kv.first.Scalar() == keys.back()) laid.nodes.push_back(kv.first);
  }
  // Mappings the override created on its way hold nothing else: their keys are its too.
  for (size_t i = 1; i < chain.size(); ++i)
    if (chain[i].Mark().is_null()) collect_nodes(chain[i], laid.nodes);
  collect_nodes(value, laid.nodes);
  return laid;
}

// ${NAME} in scalars: the environment variable NAME.
void expand_environment(const std::string& path, YAML::Node n) {
  if (n.IsMap() || n.IsSequence()) {
    for (auto it = n.begin(); it != n.end(); ++it) expand_environment(path, n.IsMap() ? it->second : *it);
    return;
  }
  if (!n.IsScalar() || n.Scalar().find("${") == std::string::npos) return;
  std::string s = n.Scalar(), out;
  for (size_t i = 0; i < s.size();) {
    const size_t open = s.find("${", i);
    if (open == std::string::npos) {
      out += s.substr(i);
      break;
    }
    const size_t close = s.find('}', open);
    if (close == std::string::npos) spec_error(path, n, fmt::format("'{}': '${{' without a closing '}}'", s));
    const std::string name = s.substr(open + 2, close - open - 2);
    const char* v = std::getenv(name.c_str());
    if (!v)
      spec_error(path, n,
                 fmt::format("'{}' needs the environment variable {}, which is not set (set it, or override the key: "
                             "kvbench run SPEC --model PATH, or --set KEY=VALUE)",
                             s, name));
    out += s.substr(i, open - i) + v;
    i = close + 1;
  }
  n = out;
}

// yaml-cpp keeps one of a mapping's repeated keys without a word (the first at the top level, the last
// below), so `budgets: [32]` ... `budgets: [64]` ran one of them silently.
void check_duplicate_keys(const std::string& path, const YAML::Node& n) {
  if (n.IsSequence())
    for (const auto& item : n) check_duplicate_keys(path, item);
  if (!n.IsMap()) return;
  std::map<std::string, YAML::Mark> first;
  for (const auto& kv : n) {
    if (kv.first.IsScalar()) {
      const auto [it, fresh] = first.emplace(kv.first.Scalar(), kv.first.Mark());
      if (!fresh)
        spec_error(path, kv.first,
                   fmt::format("key '{}' is given twice in this mapping (first on line {}); keep one",
                               kv.first.Scalar(), it->second.line + 1));
    }
    check_duplicate_keys(path, kv.second);
  }
}

}  // namespace

ExperimentSpec load_experiment(const std::string& path, const std::vector<std::string>& sets) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail("{}: cannot read the experiment spec", path);
  } catch (const YAML::Exception& e) {
    fail("{}:{}:{}: {}", path, e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  if (!root.IsMap()) fail("{}: an experiment spec is a mapping (name, model, task, methods, budgets, ...)", path);
  check_duplicate_keys(path, root);
  std::vector<Override> overrides;
  for (const auto& set : sets) overrides.push_back(apply_set(path, root, set));
  struct Scope {
    explicit Scope(const std::vector<Override>* o) : outer(current_overrides) { current_overrides = o; }
    ~Scope() { current_overrides = outer; }
    const std::vector<Override>* outer;
  } scope(&overrides);
  expand_environment(path, root);
  check_keys(path, root,
             {"name", "model", "backend", "kv_dtype", "weights", "threads", "batch", "task", "task_options", "data",
              "limit", "max_new_tokens", "methods", "budgets", "ratios", "grid", "out", "published"},
             "the spec");
  ExperimentSpec s;
  s.path = path;
  for (const auto& set : sets) s.overridden.insert(set.substr(0, std::min(set.find('.'), set.find('='))));
  for (const char* req : {"model", "task", "methods"})
    if (!root[req]) fail("{}: required key '{}' is missing", path, req);
  s.name = root["name"] ? scalar(path, root["name"], "name") : std::filesystem::path(path).stem().string();
  s.model = scalar(path, root["model"], "model");
  if (!std::filesystem::exists(s.model))
    spec_error(path, root["model"], fmt::format("model file {} not found", s.model));
  if (root["backend"]) s.backend = scalar(path, root["backend"], "backend");
  if (s.backend != "cpu" && s.backend != "cuda") spec_error(path, root["backend"], "backend must be cpu or cuda");
  if (root["kv_dtype"]) {
    try {
      s.kv_dtype = parse_kv_dtype(scalar(path, root["kv_dtype"], "kv_dtype"), "kv_dtype");
    } catch (const Error& e) {
      spec_error(path, root["kv_dtype"], e.what());
    }
  }
  if (root["weights"]) {
    try {
      s.weights = parse_weight_format(scalar(path, root["weights"], "weights"), "weights");
    } catch (const Error& e) {
      spec_error(path, root["weights"], e.what());
    }
    if (s.backend == "cuda" && *s.weights != WeightFormat::BF16)
      spec_error(path, root["weights"], "the cuda backend stores weights as bf16 only");
  }
  auto integer = [&](const char* key, long min) {
    const YAML::Node n = root[key];
    try {
      const long v = n.as<long>();
      if (v < min) spec_error(path, n, fmt::format("'{}' must be at least {}", key, min));
      return v;
    } catch (const YAML::Exception&) {
      spec_error(path, n, fmt::format("'{}' must be an integer", key));
    }
  };
  if (root["threads"]) s.threads = static_cast<int>(integer("threads", 0));
  if (root["batch"]) s.batch = static_cast<int>(integer("batch", 1));
  if (root["limit"]) s.limit = static_cast<size_t>(integer("limit", 0));
  if (root["max_new_tokens"]) s.max_new_tokens = static_cast<int>(integer("max_new_tokens", 1));
  // Beside the spec, like the table it belongs to.
  if (root["published"]) {
    const std::filesystem::path p = scalar(path, root["published"], "published");
    s.published = (p.is_absolute() ? p : std::filesystem::path(path).parent_path() / p).lexically_normal().string();
    if (!std::filesystem::exists(s.published))
      spec_error(path, root["published"], fmt::format("published table {} not found", s.published));
  }
  s.task = scalar(path, root["task"], "task");
  try {
    TaskRegistry::get().info(s.task);
  } catch (const Error& e) {
    spec_error(path, root["task"], e.what());
  }
  // A list-valued task option is a grid over task variants (e.g. RULER tasks x lengths).
  std::map<std::string, std::string> fixed;
  std::map<std::string, std::vector<std::string>> task_grid;
  if (const YAML::Node opts = root["task_options"]) {
    if (!opts.IsMap()) spec_error(path, opts, "'task_options' must be a mapping of option names to values or lists");
    for (const auto& kv : opts) {
      const std::string name = "task_options." + kv.first.Scalar();
      if (kv.second.IsSequence()) {
        if (kv.second.size() == 0) spec_error(path, kv.second, fmt::format("'{}' lists no values", name));
        for (const auto& v : kv.second) task_grid[kv.first.Scalar()].push_back(scalar(path, v, name));
      } else {
        fixed[kv.first.Scalar()] = scalar(path, kv.second, name);
      }
    }
  }
  s.task_variants = expand_grid(fixed, task_grid);
  // One setting, one cell key and report row (chat: yes is chat: true); a bad option is an error
  // here, before any cell runs.
  for (auto& variant : s.task_variants) {
    try {
      variant = TaskRegistry::get().canonical_options(s.task, variant);
    } catch (const Error& e) {
      spec_error(path, root["task_options"], e.what());
    }
  }
  s.data = root["data"] ? scalar(path, root["data"], "data") : default_data_dir();
  s.out = root["out"] ? scalar(path, root["out"], "out") : "runs/" + s.name + ".jsonl";

  std::vector<KvBudget> budgets;
  for (int t : number_list<int>(path, root["budgets"], "'budgets' must be a list of KV sizes",
                                "a budget must be a positive integer (KV size T)", [](int v) { return v > 0; }))
    budgets.emplace_back(t);
  // Compression ratios (kvpress, VECTOR): T = floor(S (1 - p_c)) per prompt.
  for (double p :
       number_list<double>(path, root["ratios"], "'ratios' must be a list of compression ratios (fractions removed)",
                           "a compression ratio must be a number in (0, 1), the fraction of the prompt removed",
                           [](double v) { return v > 0 && v < 1; }))
    budgets.push_back(KvBudget::compression_ratio(p));
  std::map<std::string, std::map<std::string, std::vector<std::string>>> grid;
  if (root["grid"]) {
    if (!root["grid"].IsMap()) spec_error(path, root["grid"], "'grid' maps a method to parameter lists");
    for (const auto& m : root["grid"]) {
      if (!m.second.IsMap()) spec_error(path, m.second, "a grid entry maps parameters to lists of values");
      for (const auto& p : m.second) {
        if (!p.second.IsSequence()) spec_error(path, p.second, "a grid parameter takes a list of values");
        for (const auto& v : p.second) grid[m.first.Scalar()][p.first.Scalar()].push_back(scalar(path, v, "grid"));
      }
    }
  }
  if (!root["methods"].IsSequence()) spec_error(path, root["methods"], "'methods' must be a list");
  for (const auto& m : root["methods"]) {
    MethodConfig base;
    if (m.IsScalar()) {
      base.name = m.Scalar();
    } else if (m.IsMap()) {
      check_keys(path, m, {"name", "params", "base_params"}, "a method");
      if (!m["name"]) spec_error(path, m, "a method needs a 'name'");
      base.name = scalar(path, m["name"], "name");
      if (m["params"]) base.params = scalar_map(path, m["params"], "params");
      // A wrapper's base parameters, the same as base.NAME keys in `params`.
      if (m["base_params"])
        for (const auto& [k, v] : scalar_map(path, m["base_params"], "base_params")) {
          if (base.params.count("base." + k))
            spec_error(path, m["base_params"],
                       fmt::format("base parameter '{}' is also given as base.{} in params", k, k));
          base.params["base." + k] = v;
        }
    } else {
      spec_error(path, m, "a method is a name or {name, params, base_params}");
    }
    const auto g = grid.find(base.name);
    for (const auto& params : g == grid.end() ? std::vector{base.params} : expand_grid(base.params, g->second)) {
      try {
        MethodRegistry::get().resolve(base.name, params);
      } catch (const Error& e) {
        spec_error(path, m, e.what());
      }
      if (base.name == "fullkv" || !MethodRegistry::get().info(base.name).budgeted) {
        s.configs.push_back({base.name, params, {}});
        continue;
      }
      if (budgets.empty()) spec_error(path, m, fmt::format("method {} needs 'budgets' or 'ratios'", base.name));
      for (const KvBudget& b : budgets) s.configs.push_back({base.name, params, b});
    }
  }
  // A grid over a method the spec does not run is a typo that would silently drop the ablation.
  for (const auto& m : root["grid"] ? root["grid"] : YAML::Node()) {
    const std::string name = m.first.Scalar();
    if (std::none_of(s.configs.begin(), s.configs.end(), [&](const MethodConfig& c) { return c.name == name; }))
      spec_error(path, m.first, fmt::format("grid for method '{}', which 'methods' does not list", name));
  }
  if (s.configs.empty()) spec_error(path, root["methods"], "no method configurations");
  return s;
}

nlohmann::json cell_config(const ModelFile& model, const std::string& model_path, const std::string& task,
                           const std::map<std::string, std::string>& task_options, const Method* method,
                           KvBudget budget, KvDtype kv_dtype, std::optional<WeightFormat> weights) {
  nlohmann::json c = {{"task", task},
                      {"options", task_options},
                      {"model", std::filesystem::path(model_path).filename().string()},
                      {"model_fingerprint", model.config().fingerprint},
                      {"method", method ? method->name() : "fullkv"},
                      {"budget", method ? budget.tokens : 0},
                      {"params", method ? nlohmann::json(method->params().keyed_values()) : nlohmann::json::object()},
                      {"gqa", method ? gqa_mode_name(method->gqa()) : "-"}};
  if (method && budget.is_ratio()) c["compression_ratio"] = budget.ratio;
  if (kv_dtype != KvDtype::F32) c["kv_dtype"] = kv_dtype_name(kv_dtype);
  if (weights && *weights != WeightFormat::F32) c["weights"] = weight_format_name(*weights);
  // A recalibrated artifact changes the numbers: its digest is part of the key (the path is not).
  if (method && !method->artifacts().is_null()) {
    nlohmann::json a = method->artifacts();
    for (auto& [k, v] : a.items())
      if (v.is_object()) v.erase("file");
    c["artifacts"] = a;
  }
  return c;
}

std::string cell_key(const nlohmann::json& config, const std::string& sample_id) {
  return fmt::format("{:016x}", fnv1a(sample_id, fnv1a(config.dump())));
}

std::string record_key(const nlohmann::json& record) {
  if (!record.contains("config") || !record.contains("id") || !record["id"].is_string())
    return record.value("key", std::string());
  nlohmann::json config = record["config"];
  config.erase("version");  // records made while the code version was part of the key carry it here
  return cell_key(config, record["id"].get<std::string>());
}

std::map<std::string, RecordedCell> recorded_cells(const std::string& path) {
  std::map<std::string, RecordedCell> cells;
  if (!std::filesystem::exists(path)) return cells;
  for_each_record(path, [&](const nlohmann::json& j, int no) {
    if (const std::string k = record_key(j); !k.empty())
      cells.emplace(k, RecordedCell{no, j.contains("prompt_digest") ? j["prompt_digest"].get<std::string>() : ""});
  });
  return cells;
}

bool recorded_with_prompt(const std::map<std::string, RecordedCell>& cells, const std::string& key,
                          const std::string& sample_id, const std::string& digest, const std::string& path,
                          const std::string& data) {
  const auto it = cells.find(key);
  if (it == cells.end()) return false;
  // A sample's id and the configuration make the key; its prompt comes from data the key does not name.
  if (!it->second.prompt_digest.empty() && it->second.prompt_digest != digest)
    fail(
        "{}:{}: sample {} of this cell was recorded from another prompt (digest {}, now {}): the data ({}), the "
        "task's files or the tokenizer changed since; write to another --out, or remove the file's records",
        path, it->second.line, sample_id, it->second.prompt_digest, digest, data);
  return true;
}

double equivalent_kv_size(const ModelConfig& m, size_t bytes) {
  return static_cast<double>(bytes) / (double(m.n_layers) * m.n_kv_heads * m.head_dim * 2 * 2);
}

PromptIds sample_prompt(const ModelFile& model, const Tokenizer& tok, const Sample& s) {
  if (s.scored_text) return {s.scored_text->ids, {}};
  if (s.choices) {  // the longest request
    PromptIds longest;
    for (const Choice& c : s.choices->options)
      if (PromptIds ids = choice_ids(tok, c, s.choices->bos);
          ids.prefill.size() + ids.after.size() > longest.prefill.size() + longest.after.size())
        longest = std::move(ids);
    return longest;
  }
  if (s.split)
    return build_split_prompt(model, tok, s.split->context, s.split->question, s.split->answer_prefix,
                              s.split->max_context);
  return {build_prompt(model, tok, s.prompt, s.chat), {}};
}

std::string prompt_digest(const PromptIds& ids) {
  auto bytes = [](const std::vector<int32_t>& v) {
    return std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int32_t));
  };
  // The two parts apart: moving a token from the prefill to the part after compression is another prompt.
  return fmt::format("{:016x}",
                     fnv1a(bytes(ids.after), fnv1a(std::to_string(ids.prefill.size()), fnv1a(bytes(ids.prefill)))));
}

PromptIds choice_ids(const Tokenizer& tok, const Choice& choice, bool bos) {
  const auto encode = [&](std::string_view text) { return bos ? tok.encode_prompt(text) : tok.encode(text); };
  PromptIds p;
  if (choice.context.empty()) {
    const auto prefix = tok.special().bos ? tok.special().bos : tok.special().eos;
    if (!prefix)
      fail("a choice with an empty context needs a BOS or EOS token to start from; the tokenizer has neither");
    p.after = tok.encode(choice.continuation);
    if (!p.after.empty() && p.after.front() == *prefix) {
      p.prefill.push_back(p.after.front());
      p.after.erase(p.after.begin());
    } else {
      p.prefill.push_back(*prefix);
    }
    return p;
  }
  const size_t end = python_rstrip_end(choice.context);
  const std::string context = choice.context.substr(0, end);
  const std::vector<int32_t> whole = encode(context + choice.context.substr(end) + choice.continuation);
  p.prefill = encode(context);
  if (p.prefill.size() < whole.size()) p.after.assign(whole.begin() + std::ptrdiff_t(p.prefill.size()), whole.end());
  return p;
}

namespace {

// What every record holds about its cell beside the prediction and its score.
nlohmann::json record_base(const ModelConfig& m, Engine& engine, const Sample& s, const nlohmann::json& config,
                           size_t prompt_tokens, size_t kept, size_t full) {
  const double t_eq = equivalent_kv_size(m, kept);
  return {{"key", cell_key(config, s.id)},
          {"id", s.id},
          {"version", code_version()},
          {"config", config},
          {"meta", s.meta},
          {"kv_dtype", kv_dtype_name(engine.kv_dtype())},
          {"weights", weight_format_name(engine.weight_format())},
          {"kernels", engine.backend().name() == "cpu" ? cpu_kernel_path() : engine.backend().name()},
          {"kv_bytes", kept},
          {"full_kv_bytes", full},
          {"T_eq", t_eq},
          // Every byte kept, per K or V element of the prompt (evicted ones count as zero bits): a full
          // fp16 cache is T_eq = prompt tokens at 16 bits.
          {"kv_bits_per_element", 16 * t_eq / double(prompt_tokens)},
          {"peak_memory_bytes", engine.backend().peak_memory_bytes()}};
}

// A multiple-choice sample: every choice's continuation scored over the cache the method keeps of its
// context, then lm-eval's acc and acc_norm (the first largest wins, as numpy's argmax).
nlohmann::json run_choices(const ModelFile& model, const Tokenizer& tok, Engine& engine, const Sample& s,
                           Method* method, KvBudget budget, const nlohmann::json& config) {
  const Choices& c = *s.choices;
  if (c.options.empty() || c.gold >= c.options.size())
    fail("sample {}: gold choice {} of {} choices", s.id, c.gold, c.options.size());
  if (c.metric == "acc_norm" && !c.acc_norm) fail("sample {}: its benchmark is not scored by acc_norm", s.id);
  engine.backend().reset_peak_memory();
  nlohmann::json scored = nlohmann::json::array();
  std::vector<double> ll, norm;
  size_t longest = 0, kept = 0;
  double prefill_seconds = 0, decode_seconds = 0, compress_seconds = 0;
  std::vector<PromptIds> requests;
  std::map<std::vector<int32_t>, int> uses;  // context ids -> choices reading them
  for (const Choice& choice : c.options) {
    requests.push_back(choice_ids(tok, choice, c.bos));
    ++uses[requests.back().prefill];
  }
  // Choices with one context (ARC, PIQA, HellaSwag) share its prefill: captured once, the method's
  // compression applied to it for each choice, as a sweep shares a prefill across methods. A method that
  // changes the model runs its own prefills.
  std::map<std::vector<int32_t>, PrefillCapture> captures;
  for (size_t k = 0; k < c.options.size(); ++k) {
    const Choice& choice = c.options[k];
    const PromptIds& ids = requests[k];
    if (ids.after.empty()) fail("sample {}: choice '{}' encodes to no continuation tokens", s.id, choice.text);
    std::unique_ptr<MethodRunner> runner;
    if (method) runner = std::make_unique<MethodRunner>(*method, budget);
    ContinuationScore r;
    if (uses[ids.prefill] > 1 && (!method || method->shares_prefill())) {
      auto it = captures.find(ids.prefill);
      if (it == captures.end()) {
        const auto t = std::chrono::steady_clock::now();
        it = captures
                 .emplace(ids.prefill, engine.prefill_capture(ids.prefill, method ? method->needs() : PrefillNeeds{}))
                 .first;
        prefill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      }
      r = continuation_loglikelihood(engine, it->second, ids.after, runner.get());
    } else {
      r = continuation_loglikelihood(engine, ids.prefill, ids.after, runner.get());
    }
    prefill_seconds += r.prefill_seconds;
    decode_seconds += r.decode_seconds;
    if (runner) compress_seconds += runner->compress_seconds();
    if (ids.prefill.size() >= longest) {
      longest = ids.prefill.size();
      kept = runner ? runner->prefill_kv_bytes() : engine.full_kv_bytes(longest);
    }
    ll.push_back(r.loglikelihood);
    norm.push_back(r.loglikelihood / double(python_len(choice.text)));
    scored.push_back({{"loglikelihood", r.loglikelihood},
                      {"greedy", r.greedy},
                      {"context_tokens", ids.prefill.size()},
                      {"continuation_tokens", ids.after.size()}});
  }
  const auto first_max = [](const std::vector<double>& v) {
    return size_t(std::distance(v.begin(), std::max_element(v.begin(), v.end())));
  };
  const size_t pick = first_max(ll), pick_norm = first_max(norm);
  const double acc = pick == c.gold, acc_norm = pick_norm == c.gold;
  nlohmann::json rec = record_base(model.config(), engine, s, config, longest, kept, engine.full_kv_bytes(longest));
  rec["protocol"] = {{"chat", false}, {"choices", c.options.size()}, {"bos", c.bos}, {"metric", c.metric}};
  rec["prediction"] = c.options[c.metric == "acc_norm" ? pick_norm : pick].text;
  rec["answers"] = {c.options[c.gold].text};
  rec["score"] = c.metric == "acc_norm" ? acc_norm : acc;
  rec["acc"] = acc;
  if (c.acc_norm) rec["acc_norm"] = acc_norm;
  rec["choices"] = scored;
  rec["prompt_tokens"] = longest;
  rec["prefill_seconds"] = prefill_seconds;
  rec["prefill_shared"] = false;
  rec["decode_seconds"] = decode_seconds;
  rec["compress_seconds"] = compress_seconds;
  rec["cache"] = nullptr;
  return rec;
}

// A perplexity window: the compressed prefix's own predictions, then each later token predicted over
// the cache the method kept.
nlohmann::json run_scored_text(const ModelFile& model, Engine& engine, const Sample& s, Method* method, KvBudget budget,
                               const nlohmann::json& config) {
  const ScoredText& st = *s.scored_text;
  const size_t n = st.ids.size(), c = st.compress_at > 0 ? size_t(st.compress_at) : n;
  if (n < 2 || c > n) fail("sample {}: a window of {} tokens compressed at {}", s.id, n, c);
  std::unique_ptr<MethodRunner> runner;
  if (method) runner = std::make_unique<MethodRunner>(*method, budget);
  engine.backend().reset_peak_memory();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<double> lp;
  const std::span<const int32_t> ids(st.ids);
  std::vector<float> logits = engine.prefill(ids.first(c), runner.get(), &lp);
  const double prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  t0 = std::chrono::steady_clock::now();
  for (size_t t = c; t < n; ++t) {
    lp.push_back(log_softmax_at(logits, ids[t]));
    if (t + 1 < n) logits = engine.decode(ids[t]);
  }
  const double decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double sum = 0;
  for (double x : lp) sum += x;
  const double nll = -sum / double(lp.size());
  const size_t full = engine.full_kv_bytes(c);
  nlohmann::json rec =
      record_base(model.config(), engine, s, config, c, runner ? runner->prefill_kv_bytes() : full, full);
  rec["protocol"] = {{"chat", false}, {"tokens", n}, {"compress_at", c}};
  rec["prediction"] = "";
  rec["answers"] = nlohmann::json::array();
  rec["score"] = nll;
  rec["nll"] = nll;
  rec["perplexity"] = std::exp(nll);
  rec["scored_tokens"] = lp.size();
  rec["prompt_tokens"] = c;
  rec["prefill_seconds"] = prefill_seconds;
  rec["prefill_shared"] = false;
  rec["decode_seconds"] = decode_seconds;
  rec["compress_seconds"] = runner ? runner->compress_seconds() : 0.0;
  rec["cache"] = runner ? runner->cache_profile() : nlohmann::json(nullptr);
  return rec;
}

}  // namespace

namespace {

// A generation sample's prompt and the options every cell of it generates with.
struct GenerationSetup {
  std::vector<int32_t> prompt;
  GenerateOptions opt;
};

GenerationSetup generation_setup(const ModelFile& model, const Tokenizer& tok, const Sample& s) {
  PromptIds ids = sample_prompt(model, tok, s);
  GenerationSetup g{std::move(ids.prefill), {}};
  g.opt.after_prefill = std::move(ids.after);
  g.opt.first_token_can_stop = !s.split;  // a split sample runs kvpress's pipeline, quirks included
  g.opt.max_new_tokens = s.max_new_tokens;
  g.opt.min_new_tokens = s.min_new_tokens;
  g.opt.stop = s.stop;
  for (const std::string& text : s.end_texts) {
    const std::vector<int32_t> end = tok.encode(text, false);
    if (end.empty()) fail("sample {}: end text '{}' encodes to no token", s.id, text);
    g.opt.end_tokens.push_back(end.back());
  }
  return g;
}

nlohmann::json generation_record(const ModelFile& model, Engine& engine, const Task& task, const Sample& s,
                                 const nlohmann::json& config, const GenerationSetup& setup, const Generation& g,
                                 const MethodRunner* runner, bool shared) {
  const size_t full = engine.full_kv_bytes(setup.prompt.size());
  const size_t kept = runner ? runner->prefill_kv_bytes() : full;
  nlohmann::json rec = record_base(model.config(), engine, s, config, setup.prompt.size(), kept, full);
  rec.update(nlohmann::json{{"protocol",
                             {{"chat", s.chat},
                              {"max_new_tokens", s.max_new_tokens},
                              {"min_new_tokens", s.min_new_tokens},
                              {"stop", s.stop},
                              {"end_texts", s.end_texts},
                              {"after_compression_tokens", setup.opt.after_prefill.size()}}},
                            {"prediction", g.text},
                            {"stop_reason", g.stop_reason},
                            {"generated_tokens", g.tokens.size()},
                            {"tokens_past_context", g.past_context},
                            {"answers", s.answers},
                            {"score", task.score(s, g.text)},
                            {"prompt_tokens", g.prompt_tokens},
                            {"prefill_seconds", g.prefill_seconds},
                            {"prefill_shared", shared},
                            {"decode_seconds", g.decode_seconds},
                            {"compress_seconds", runner ? runner->compress_seconds() : 0.0},
                            {"cache", runner ? runner->cache_profile() : nlohmann::json(nullptr)}});
  return rec;
}

}  // namespace

nlohmann::json run_cell(const ModelFile& model, const Tokenizer& tok, Engine& engine, const Task& task, const Sample& s,
                        Method* method, KvBudget budget, const nlohmann::json& config, const PrefillCapture* capture) {
  if (s.choices || s.scored_text) {
    if (capture) fail("sample {}: a multiple-choice or perplexity sample runs its own prefill", s.id);
    return s.choices ? run_choices(model, tok, engine, s, method, budget, config)
                     : run_scored_text(model, engine, s, method, budget, config);
  }
  const GenerationSetup setup = generation_setup(model, tok, s);
  std::unique_ptr<MethodRunner> runner;
  if (method) runner = std::make_unique<MethodRunner>(*method, budget);
  engine.backend().reset_peak_memory();
  const Generation g = capture ? generate(engine, tok, *capture, setup.opt, runner.get())
                               : generate(engine, tok, setup.prompt, setup.opt, runner.get());
  return generation_record(model, engine, task, s, config, setup, g, runner.get(), capture != nullptr);
}

std::vector<CellOutcome> run_cells(const ModelFile& model, const Tokenizer& tok, Engine& engine, const Task& task,
                                   const Sample& s, std::span<const CellRun> cells, const PrefillCapture* capture) {
  using clock = std::chrono::steady_clock;
  if (s.choices || s.scored_text)
    fail("sample {}: the cells of a multiple-choice or perplexity sample do not decode together", s.id);
  const GenerationSetup setup = generation_setup(model, tok, s);
  std::vector<CellOutcome> out(cells.size());
  std::vector<std::unique_ptr<MethodRunner>> runners(cells.size());
  std::vector<Sequence> seqs;
  seqs.reserve(cells.size());  // decode_batch holds pointers into it
  std::vector<std::vector<float>> first;
  std::vector<size_t> started;
  std::vector<double> start_seconds;
  engine.backend().reset_peak_memory();
  for (size_t i = 0; i < cells.size(); ++i) {
    const auto t = clock::now();
    try {
      if (cells[i].method) runners[i] = std::make_unique<MethodRunner>(*cells[i].method, cells[i].budget);
      std::vector<float> logits =
          capture ? engine.resume(*capture, runners[i].get()) : engine.prefill(setup.prompt, runners[i].get());
      for (int32_t id : setup.opt.after_prefill) logits = engine.decode(id);
      seqs.push_back(engine.detach());
      first.push_back(std::move(logits));
      started.push_back(i);
      start_seconds.push_back(std::chrono::duration<double>(clock::now() - t).count());
    } catch (const Error& e) {
      out[i].error = e.what();
    }
  }
  std::vector<Generation> gens;
  try {
    gens = generate_batch(engine, tok, seqs, std::move(first), setup.opt);
  } catch (const Error& e) {
    for (size_t i : started) out[i].error = e.what();
    return out;
  }
  for (size_t j = 0; j < started.size(); ++j) {
    const size_t i = started[j];
    Generation& g = gens[j];
    g.prompt_tokens = static_cast<int>(setup.prompt.size() + setup.opt.after_prefill.size());
    g.prefill_seconds = capture ? 0.0 : start_seconds[j];
    try {
      out[i].record =
          generation_record(model, engine, task, s, *cells[i].config, setup, g, runners[i].get(), capture != nullptr);
    } catch (const Error& e) {
      out[i].error = e.what();
      continue;
    }
    out[i].record["decode_batch"] = seqs.size();
    out[i].seconds = start_seconds[j] + g.decode_seconds;
  }
  return out;
}

KvBudget config_budget(const nlohmann::json& config) {
  if (config.contains("compression_ratio"))
    return KvBudget::compression_ratio(config["compression_ratio"].get<double>());
  return config.value("budget", 0);
}

}  // namespace kvb
