#pragma once
// Benchmarks as tasks: a task produces samples (the model input, reference answers, decoding limits,
// metadata such as context length and needle depth) deterministically for a given tokenizer, and
// scores a prediction with the benchmark's own metric. Tasks register by name from their own file,
// like methods, so that a new benchmark is one file.
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/method/params.hpp"

namespace kvb {

class Tokenizer;

struct Sample {
  std::string id;      // unique within the task, stable across runs (results are keyed by it)
  std::string prompt;  // the model input text
  bool chat = false;   // whether the protocol wraps the prompt in the model's chat template
  std::vector<std::string> answers;
  int max_new_tokens = 0;
  int min_new_tokens = 0;         // end-of-generation tokens are masked before this many
  std::vector<std::string> stop;  // stop strings (the text is cut before the first)
  nlohmann::json meta;            // length, depth, category, ...
};

// What a task is built from: the model's tokenizer (sizing is in its tokens), the task's options and
// the directory holding benchmark data (haystacks, word lists, official files).
struct TaskContext {
  const Tokenizer* tokenizer = nullptr;
  std::map<std::string, std::string> options;
  std::string data_dir;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual size_t size() const = 0;
  virtual Sample sample(size_t index) const = 0;
  // Score of one prediction in [0, 1] as the benchmark defines it.
  virtual double score(const Sample& sample, const std::string& prediction) const = 0;
};

struct TaskInfo {
  std::string name;
  std::string summary;
  std::vector<ParamSpec> options;
  std::function<std::unique_ptr<Task>(const TaskContext&, const Params&)> make;
};

class TaskRegistry {
 public:
  static TaskRegistry& get();
  void add(TaskInfo info);
  const TaskInfo& info(const std::string& name) const;  // Error listing the tasks if unknown
  std::vector<std::string> names() const;
  std::unique_ptr<Task> create(const std::string& name, const TaskContext& ctx) const;
  // The given options as the task reads them (yes -> true, 05 -> 5), none added: what records keep,
  // so that one setting has one cell key. Error naming the option if one is unknown or invalid.
  std::map<std::string, std::string> canonical_options(const std::string& name,
                                                       const std::map<std::string, std::string>& given) const;

 private:
  std::map<std::string, TaskInfo> tasks_;
};

// Registers a task from its own file: static const bool reg = register_task({...});
bool register_task(TaskInfo info);

// Default directory of benchmark data fetched by scripts/setup.sh ($KVBENCH_DATA or <source>/data).
std::string default_data_dir();

// The Paul Graham essays of the haystacks (<data>/PaulGrahamEssays/*.txt) concatenated in file-name
// order, as the NIAH repositories and RULER's essay file join them; errors name `task`.
struct Essays {
  std::string text;
  int files = 0;
};
Essays read_essays(const std::string& data_dir, const std::string& task);

}  // namespace kvb
