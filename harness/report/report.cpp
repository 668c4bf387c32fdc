#include "harness/report/report.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "harness/experiment/results.hpp"
#include "harness/report/heatmap.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

using nlohmann::json;

struct Group {
  json config;
  double score = 0, kv_share = 0;
  int n = 0;
  std::map<std::pair<int, int>, std::pair<double, int>> niah;  // (depth, length) -> sum, count
};

std::string params_text(const json& p) {
  std::string s;
  for (const auto& [k, v] : p.items()) s += (s.empty() ? "" : " ") + k + "=" + v.get<std::string>();
  return s.empty() ? "-" : s;
}

// `used` keeps the names already written, so that configurations differing only in parameters (an
// ablation grid) get numbered files instead of overwriting each other.
void write_niah_heatmap(const Group& g, const std::string& dir, std::set<std::string>& used) {
  Heatmap h;
  std::set<int> depths, lengths;
  for (const auto& [dl, v] : g.niah) {
    depths.insert(dl.first);
    lengths.insert(dl.second);
  }
  h.depths.assign(depths.begin(), depths.end());
  h.lengths.assign(lengths.begin(), lengths.end());
  h.cells.assign(h.depths.size(), std::vector<double>(h.lengths.size(), std::nan("")));
  for (const auto& [dl, v] : g.niah) {
    const auto r = std::find(h.depths.begin(), h.depths.end(), dl.first) - h.depths.begin();
    const auto c = std::find(h.lengths.begin(), h.lengths.end(), dl.second) - h.lengths.begin();
    h.cells[size_t(r)][size_t(c)] = v.first / v.second;
  }
  const std::string method = g.config.value("method", "fullkv");
  const int budget = g.config.value("budget", 0);
  h.title = "Pressure Testing " + g.config.value("model", std::string("model"));
  h.caption = fmt::format("{} Score: {:.2f}", method == "fullkv" ? "FullKV" : fmt::format("{} (KV size {})", method, budget),
                          100.0 * g.score / g.n);
  const bool chat = g.config["options"].value("chat", "false") == "true";
  const std::string base =
      fmt::format("{}/niah-{}{}{}{}", dir, method, method == "fullkv" ? "" : fmt::format("-T{}", budget),
                  chat ? "-chat" : "", g.config.value("gqa", "-") == "repeat" ? "-repeat" : "");
  std::string stem = base;
  for (int i = 2; used.count(stem); ++i) stem = fmt::format("{}-{}", base, i);
  used.insert(stem);
  write_heatmap(h, stem);
}

}  // namespace

void write_report(const std::vector<std::string>& files, const std::string& dir) {
  std::map<std::string, Group> groups;
  for (const auto& f : files) {
    if (!std::filesystem::exists(f)) fail("{}: not found", f);
    for_each_record(f, [&](const json& j, int no) {
      if (!j.contains("config") || !j.contains("score") || !j["score"].is_number())
        fail("{}:{}: not a kvbench result record (config and score expected)", f, no);
      json cfg = j["config"];
      // Runs over different parts of one grid belong to one configuration.
      for (const char* k : {"s_len", "e_len", "step", "depths", "samples"}) cfg["options"].erase(k);
      cfg.erase("version");
      Group& g = groups[cfg.dump()];
      g.config = cfg;
      g.score += j["score"].get<double>();
      const double full = j.value("full_kv_bytes", 0.0);
      g.kv_share += full > 0 ? j.value("kv_bytes", 0.0) / full : 1.0;
      ++g.n;
      if (cfg.value("task", "") == "niah" && j.contains("meta") && j["meta"].contains("depth")) {
        auto& cell = g.niah[{j["meta"]["depth"].get<int>(), j["meta"]["length"].get<int>()}];
        cell.first += j["score"].get<double>();
        ++cell.second;
      }
    });
  }
  if (groups.empty()) fail("no result records in the given files");
  std::filesystem::create_directories(dir);
  std::string md = "| task | options | method | KV size | gqa | params | samples | score | KV kept |\n"
                   "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
  std::string csv = "task,options,method,budget,gqa,params,samples,score,kv_kept_percent\n";
  std::set<std::string> used;
  // Rows by task, options, method, then budget (full cache first, budgets ascending).
  std::vector<const Group*> rows;
  for (const auto& [key, g] : groups) rows.push_back(&g);
  std::stable_sort(rows.begin(), rows.end(), [](const Group* a, const Group* b) {
    auto k = [](const Group* g) {
      return std::tuple(g->config.value("task", ""), g->config["options"].dump(), g->config.value("method", "") != "fullkv",
                        g->config.value("method", ""), g->config.value("budget", 0), g->config.dump());
    };
    return k(a) < k(b);
  });
  for (const Group* gp : rows) {
    const Group& g = *gp;
    const json& c = g.config;
    std::string opts;
    for (const auto& [k, v] : c["options"].items()) opts += (opts.empty() ? "" : " ") + k + "=" + v.get<std::string>();
    if (opts.empty()) opts = "-";
    const std::string budget = c.value("budget", 0) ? std::to_string(c.value("budget", 0)) : "full";
    const double score = 100.0 * g.score / g.n, kv = 100.0 * g.kv_share / g.n;
    const std::string params = params_text(c.value("params", json::object()));
    md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {:.2f} | {:.1f}% |\n", c.value("task", ""), opts,
                      c.value("method", ""), budget, c.value("gqa", "-"), params, g.n, score, kv);
    csv += fmt::format("{},\"{}\",{},{},{},\"{}\",{},{:.4f},{:.2f}\n", c.value("task", ""), opts, c.value("method", ""),
                       budget, c.value("gqa", "-"), params, g.n, score, kv);
    if (!g.niah.empty()) write_niah_heatmap(g, dir, used);
  }
  std::ofstream(dir + "/summary.md") << md;
  std::ofstream(dir + "/summary.csv") << csv;
  fmt::print("{}\nwrote {}/summary.md, summary.csv{}\n", md, dir,
             std::any_of(groups.begin(), groups.end(), [](const auto& g) { return !g.second.niah.empty(); })
                 ? " and NIAH heatmaps (niah-*.png, .svg, .csv)"
                 : "");
}

}  // namespace kvb
