#include "tasks/task.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/util/error.hpp"

namespace kvb {

TaskRegistry& TaskRegistry::get() {
  static TaskRegistry r;
  return r;
}

void TaskRegistry::add(TaskInfo info) {
  if (tasks_.count(info.name)) fail("task '{}' is registered twice", info.name);
  tasks_.emplace(info.name, std::move(info));
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
    fail("task {}: haystack directory {} not found (scripts/setup.sh fetches the Paul Graham essays; or set "
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

}  // namespace kvb
