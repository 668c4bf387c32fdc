#include "harness/experiment/published.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <ranges>
#include <set>

#include <yaml-cpp/yaml.h>

#include "harness/experiment/experiment.hpp"
#include "harness/task/task.hpp"
#include "harness/util/error.hpp"

namespace kvb {

using nlohmann::json;

namespace {

const char* const kHeader = "table,model,method,params,budget,task,length,column,score";

// One CSV record (RFC 4180 quoting; the files hold no line breaks inside fields).
std::vector<std::string> csv_fields(const std::string& line, const std::string& where) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        out.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        out.back() += c;
      }
    } else if (c == '"' && out.back().empty()) {
      quoted = true;
    } else if (c == ',') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  if (quoted) fail("{}: a quoted field is not closed", where);
  return out;
}

bool parse_number(const std::string& s, double& v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size() && std::isfinite(v);
}

}  // namespace

std::string budget_text(const KvBudget& b) {
  return b.is_full() ? "full" : b.is_ratio() ? fmt::format("r{}", b.ratio) : std::to_string(b.tokens);
}

std::string params_text(const std::map<std::string, std::string>& p) {
  std::string s;
  for (const auto& [k, v] : p) s += (s.empty() ? "" : " ") + k + "=" + v;
  return s;
}

std::string describe(const PublishedRow& r) {
  return fmt::format("{}{} at {}, column {}{}", r.method, r.params.empty() ? "" : " (" + params_text(r.params) + ")",
                     budget_text(r.budget), r.column, r.length ? fmt::format(" at length {}", r.length) : "");
}

bool same_budget(const KvBudget& a, const KvBudget& b) {
  return a.is_ratio() == b.is_ratio() && a.tokens == b.tokens && std::abs(a.ratio - b.ratio) < 1e-9;
}

bool row_matches_config(const PublishedRow& r, const json& c, bool budget) {
  if (c.value("method", "") != r.method || (budget && !same_budget(config_budget(c), r.budget))) return false;
  const json& p = c.contains("params") ? c["params"] : json::object();
  for (const auto& [k, v] : r.params)
    if (!p.contains(k) || !p[k].is_string() || p[k].get<std::string>() != v) return false;
  return true;
}

std::string best_of(const PublishedRow& r) { return r.method == "kvcrush*" ? "kvcrush" : ""; }

namespace {
// The registered tasks whose records a paper table can hold.
std::vector<std::string> paper_tasks() {
  std::vector<std::string> out;
  for (const auto& n : TaskRegistry::get().names())
    if (const auto& l = TaskRegistry::get().info(n).layout; !l.title.empty() || l.depth_heatmap) out.push_back(n);
  return out;
}
}  // namespace

bool column_in_options(const PublishedRow& r, const std::map<std::string, std::string>& o) {
  auto has = [&](const std::string& k, const std::string& v) { return o.count(k) && o.at(k) == v; };
  const TaskLayout& l = TaskRegistry::get().info(r.task).layout;
  if (l.column_option.empty()) return true;  // one score over the task's grid (NIAH)
  return has(l.column_option, r.column) && (!r.length || has(l.length_option, std::to_string(r.length)));
}

bool summary_column(const std::string& c) { return c == "avg" || c == "score"; }

std::string external_names_path(const std::string& published_csv) {
  return (std::filesystem::path(published_csv).parent_path().parent_path() / "external.yaml").string();
}

namespace {

bool registered_method(const std::string& m) {
  const auto names = MethodRegistry::get().names();
  return std::find(names.begin(), names.end(), m) != names.end();
}

// A mapping entry's text: `what` and, when given, `(reference)`.
std::string entry_text(const std::string& file, const std::string& name, const YAML::Node& n) {
  if (n.IsScalar()) return n.as<std::string>();
  if (!n.IsMap() || !n["what"]) fail("{}: '{}' needs a 'what' line (and a 'reference')", file, name);
  std::string s = n["what"].as<std::string>();
  if (n["reference"]) s += " (" + n["reference"].as<std::string>() + ")";
  return s;
}

}  // namespace

ExternalNames load_external_names(const std::string& path) {
  ExternalNames names;
  if (!std::filesystem::exists(path)) return names;
  names.file = path;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    fail("{}: not valid YAML: {}", path, e.what());
  }
  if (!root.IsMap()) fail("{}: expected a mapping with methods, parameters, tasks and models", path);
  try {
    for (const auto& section : root) {
      const auto key = section.first.as<std::string>();
      const YAML::Node& body = section.second;
      if (!body.IsMap()) fail("{}: '{}' must be a mapping", path, key);
      for (const auto& e : body) {
        const auto name = e.first.as<std::string>();
        if (key == "methods") {
          if (registered_method(name))
            fail("{}: methods: '{}' is a kvbench method now; remove it from the file", path, name);
          names.methods[name] = entry_text(path, name, e.second);
        } else if (key == "parameters") {
          if (!registered_method(name)) fail("{}: parameters: '{}' is not a kvbench method", path, name);
          const auto specs = MethodRegistry::get().param_specs(name);
          for (const auto& p : e.second) {
            const auto param = p.first.as<std::string>();
            if (std::any_of(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == param; }))
              fail("{}: parameters: {} has '{}' now; remove it from the file", path, name, param);
            names.parameters[name][param] = p.second.as<std::string>();
          }
        } else if (key == "tasks") {
          if (TaskRegistry::get().find(name)) fail("{}: tasks: '{}' is a kvbench task now; remove it", path, name);
          if (!e.second.IsMap() || !e.second["columns"] || !e.second["columns"].IsSequence())
            fail("{}: tasks: '{}' needs its columns, a list", path, name);
          names.tasks[name] = e.second["columns"].as<std::vector<std::string>>();
        } else if (key == "models") {
          names.models[name] = e.second.as<std::string>();
        } else {
          fail("{}: unknown section '{}' (expected methods, parameters, tasks, models)", path, key);
        }
      }
    }
  } catch (const YAML::Exception& e) {
    fail("{}: {}", path, e.what());
  }
  return names;
}

std::vector<PublishedRow> load_published(const std::string& path) {
  return load_published(path, load_external_names(external_names_path(path)));
}

std::vector<PublishedRow> load_published(const std::string& path, const ExternalNames& names) {
  const std::string declared = names.file.empty() ? "experiments/papers/external.yaml" : names.file;
  std::ifstream in(path);
  if (!in) fail("{}: cannot read the published table", path);
  std::string line;
  if (!std::getline(in, line) || (line.erase(line.find_last_not_of("\r") + 1), line != kHeader))
    fail("{}:1: expected the header '{}'", path, kHeader);
  std::vector<PublishedRow> rows;
  for (int no = 2; std::getline(in, line); ++no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = fmt::format("{}:{}", path, no);
    const auto f = csv_fields(line, where);
    if (f.size() != 9) fail("{}: {} fields, expected 9 ({})", where, f.size(), kHeader);
    PublishedRow r;
    r.file = path;
    r.line = no;
    r.table = f[0];
    r.model = f[1];
    r.method = f[2];
    for (const auto& [i, name] : std::vector<std::pair<int, const char*>>{
             {0, "table"}, {1, "model"}, {2, "method"}, {5, "task"}, {7, "column"}})
      if (f[size_t(i)].empty()) fail("{}: field '{}' is empty", where, name);
    for (size_t a = 0; a < f[3].size();) {
      const size_t b = std::min(f[3].find(' ', a), f[3].size());
      const std::string kv = f[3].substr(a, b - a);
      const size_t eq = kv.find('=');
      if (!kv.empty() && (eq == std::string::npos || eq == 0))
        fail("{}: field 'params': '{}' is not key=value", where, kv);
      if (!kv.empty()) r.params[kv.substr(0, eq)] = kv.substr(eq + 1);
      a = b + 1;
    }
    double v = 0;
    if (f[4] == "full") {
      r.budget = KvBudget{};
    } else if (f[4].size() > 1 && f[4][0] == 'r' && parse_number(f[4].substr(1), v) && v > 0 && v < 1) {
      r.budget = KvBudget::compression_ratio(v);
    } else if (parse_number(f[4], v) && v >= 1 && v == std::floor(v) && v < 1e9) {
      r.budget = KvBudget(static_cast<int>(v));
    } else {
      fail("{}: field 'budget': expected full, a KV size (a positive whole number) or r<ratio> (r0.5), not '{}'", where,
           f[4]);
    }
    if (!names.models.empty() && !names.models.count(r.model))
      fail("{}: field 'model': '{}' is not among the models {} lists with their architectures", where, r.model,
           declared);
    const std::string method = best_of(r).empty() ? r.method : best_of(r);
    if (registered_method(method)) {
      const auto specs = MethodRegistry::get().param_specs(method);
      const bool wrapper = MethodRegistry::get().info(method).composition == Composition::Wrapper;
      for (const auto& k : r.params | std::views::keys) {
        const bool own = std::any_of(specs.begin(), specs.end(), [&](const ParamSpec& s) { return s.name == k; });
        const bool external = names.parameters.count(method) && names.parameters.at(method).count(k);
        if (external && r.external.empty()) r.external = fmt::format("parameter {} of {}", k, method);
        if (!own && !external && !(wrapper && k.rfind("base.", 0) == 0))
          fail("{}: field 'params': method {} has no parameter '{}' (nor does {} declare it under parameters)", where,
               method, k, declared);
      }
    } else if (names.methods.count(method)) {
      r.external = "method " + method;
    } else {
      fail("{}: field 'method': '{}' is neither a kvbench method (kvbench list methods) nor declared in {}", where,
           r.method, declared);
    }
    r.task = f[5];
    const TaskInfo* task = TaskRegistry::get().find(r.task);
    r.column = f[7];
    if (names.tasks.count(r.task)) {
      if (r.external.empty()) r.external = "task " + r.task;
      const auto& cols = names.tasks.at(r.task);
      if (std::find(cols.begin(), cols.end(), r.column) == cols.end())
        fail("{}: field 'column': task {} has the columns {} ({}), not '{}'", where, r.task, fmt::join(cols, ", "),
             declared, r.column);
      if (!f[6].empty()) fail("{}: field 'length': task {} has no length", where, r.task);
      if (!parse_number(f[8], r.score)) fail("{}: field 'score': expected a number, not '{}'", where, f[8]);
      r.printed = f[8];
      rows.push_back(std::move(r));
      continue;
    }
    if (!task || (task->layout.title.empty() && !task->layout.depth_heatmap))
      fail("{}: field 'task': expected a task with a paper layout ({}) or one {} declares, not '{}'", where,
           fmt::join(paper_tasks(), ", "), declared, r.task);
    if (const auto& l = task->layout;
        !l.column_option.empty() && !l.columns.empty() && !summary_column(r.column) &&
        std::none_of(l.columns.begin(), l.columns.end(), [&](const ReportColumn& c) { return c.key == r.column; }))
      fail("{}: field 'column': '{}' is not a column of {} (its {} values, avg)", where, r.column, r.task,
           l.column_option);
    if (!task->layout.length_option.empty() && !f[6].empty()) {
      if (!parse_number(f[6], v) || v < 1 || v != std::floor(v))
        fail(
            "{}: field 'length': a {} context length in tokens, or blank for the mean over the spec's lengths, "
            "not '{}'",
            where, task->layout.title, f[6]);
      r.length = static_cast<int>(v);
    } else if (!f[6].empty()) {
      fail("{}: field 'length': only rows of tasks with a length option have a length ('{}' given for {})", where, f[6],
           r.task);
    }
    if (!parse_number(f[8], r.score)) fail("{}: field 'score': expected a number, not '{}'", where, f[8]);
    r.printed = f[8];
    rows.push_back(std::move(r));
  }
  if (rows.empty()) fail("{}: no rows after the header", path);
  return rows;
}

void check_published(const std::vector<PublishedRow>& rows, const std::string& table, const std::string& spec_path,
                     const std::string& task, const std::vector<json>& configs,
                     const std::vector<std::map<std::string, std::string>>& variants, PublishedChecks checks) {
  size_t mine = 0;
  for (const auto& r : rows) {
    if (r.table != table) continue;
    ++mine;
    if (!r.external.empty()) continue;  // what kvbench lacks: counted by report --coverage, run by no spec
    const std::string where = fmt::format("{}:{}: published row {}", r.file, r.line, describe(r));
    if (r.task != task) fail("{}: its task is {}, the spec {} runs {}", where, r.task, spec_path, task);
    // A derived row needs the configurations it is the best of.
    PublishedRow run = r;
    if (const std::string base = best_of(r); !base.empty()) {
      if (!r.params.empty()) fail("{}: a row derived from the {} rows lists no parameters", where, base);
      run.method = base;
    }
    if (std::none_of(configs.begin(), configs.end(),
                     [&](const json& c) { return c.value("method", "") == run.method; })) {
      if (!checks.methods) continue;
      fail("{}: the spec {} does not run method {}", where, spec_path, run.method);
    }
    if (std::none_of(configs.begin(), configs.end(), [&](const json& c) {
          return checks.budgets ? row_matches_config(run, c) : row_matches_config(run, c, false);
        }))
      fail("{}: no configuration of {} in the spec {} has these parameters{}", where, r.method, spec_path,
           checks.budgets ? " and this budget" : "");
    if (checks.columns && !summary_column(r.column) &&
        std::none_of(variants.begin(), variants.end(), [&](const auto& o) { return column_in_options(r, o); }))
      fail("{}: the spec {} has no task variant for this column (its task_options)", where, spec_path);
  }
  if (!mine && !rows.empty())
    fail("{}: no rows for table '{}' (the spec {}); its tables are named by their specs' file names", rows.front().file,
         table, spec_path);
}

}  // namespace kvb
