#pragma once
// Experiments: a YAML spec names a model, a task with its options, methods (with parameters and an
// optional parameter grid for ablations) and budgets; it expands into cells (sample x method
// configuration x budget), each with a stable key, run once and recorded in a results file.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "harness/engine/backend.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/method.hpp"

namespace kvb {

class ModelFile;
class Tokenizer;
class Engine;
class Task;
struct Sample;
struct Choice;
struct PrefillCapture;

struct MethodConfig {
  std::string name;
  std::map<std::string, std::string> params;
  KvBudget budget;  // none for fullkv
};

struct ExperimentSpec {
  std::string path, name, model, backend = "cpu", task, data, out;
  KvDtype kv_dtype = KvDtype::F32;                     // what the cache stores full-precision numbers as
  std::optional<WeightFormat> weights = std::nullopt;  // how weight matrices are stored; unset: the backend's own
  int threads = 0;
  // Cells of a sample decoded together (run_cells): weights read once per step for up to this many. It
  // moves times, not results, so it is not part of a cell's key.
  int batch = 1;
  size_t limit = 0;
  int max_new_tokens = 0;  // > 0: caps every sample's generation (a smoke run's knob; part of the cell key)
  std::string published;   // a published.csv of the paper table the spec regenerates (path as resolved), or empty
  std::set<std::string> overridden;  // top-level keys replaced or reached into by load_experiment's `sets`
  std::vector<std::map<std::string, std::string>> task_variants;  // task options, list values expanded
  std::vector<MethodConfig> configs;                              // methods x grid x (budgets, then ratios), expanded
};

// Parses and validates a spec; errors name the file, line and column, and list the valid keys.
// `sets` are overrides "key=value" laid over the file before validation: a dotted key reaches into
// mappings (task_options.length), the value is YAML ([4096, 8192] is a list). `${NAME}` in a value is
// the environment variable NAME (model: ${MODEL}); an unset one is an error.
ExperimentSpec load_experiment(const std::string& path, const std::vector<std::string>& sets = {});

// A record's budget from its config: its KV size, or the compression ratio it ran at; none for the
// full cache.
KvBudget config_budget(const nlohmann::json& config);

// Identity of a configuration's results: everything that moves its numbers. The KV dtype and the
// weight format are part of it unless fp32 (so that records made before they were options keep
// their keys).
nlohmann::json cell_config(const ModelFile& model, const std::string& model_path, const std::string& task,
                           const std::map<std::string, std::string>& task_options, const Method* method,
                           KvBudget budget, KvDtype kv_dtype = KvDtype::F32,
                           std::optional<WeightFormat> weights = std::nullopt);
// The papers' memory unit T_eq (fp16 token units): bytes / (layers x KV heads x 2 x head_dim x 2 bytes), i.e.
// the KV size T of a full fp16 cache holding as many bytes.
double equivalent_kv_size(const ModelConfig& m, size_t bytes);
// FNV-1a 64 of the configuration and the sample id, as 16 hex digits. The code version is recorded
// with every result but is not part of its key: a sweep resumes across commits (start a new results
// file for numbers from changed code).
std::string cell_key(const nlohmann::json& config, const std::string& sample_id);
// The key of a recorded result, from its configuration and sample id (records made while the code
// version was part of the key are keyed without it, like new ones).
std::string record_key(const nlohmann::json& record);
// The cells a results file records (none if it does not exist), by key: each one's line and, where
// recorded, its sample's prompt_digest.
struct RecordedCell {
  int line = 0;
  std::string prompt_digest;
  bool operator==(const RecordedCell&) const = default;
};
std::map<std::string, RecordedCell> recorded_cells(const std::string& path);
// Whether `key` is recorded in `path` (its cells, as read above); an error where it was recorded from
// another prompt than `digest` gives now (another data directory `data`, edited data, another tokenizer).
bool recorded_with_prompt(const std::map<std::string, RecordedCell>& cells, const std::string& key,
                          const std::string& sample_id, const std::string& digest, const std::string& path,
                          const std::string& data);

// The token ids of a sample as its protocol feeds them: the whole prompt prefilled (chat template as
// the sample says), or under a kvpress protocol the context prefilled and the rest after compression;
// a perplexity window's ids; a multiple-choice sample's longest request.
PromptIds sample_prompt(const ModelFile& model, const Tokenizer& tok, const Sample& s);
// A digest of those ids (16 hex digits; the record's prompt_digest).
std::string prompt_digest(const PromptIds& ids);

// The token ids of a multiple-choice option as lm-evaluation-harness encodes a loglikelihood request
// (HFLM._encode_pair): the context's trailing whitespace moves to the continuation, and the
// continuation is what the encoding of the whole text holds past the context's own token count. An
// empty context becomes BOS (EOS without one), as lm-eval's prefix token.
PromptIds choice_ids(const Tokenizer& tok, const Choice& choice, bool bos);

// Generates the sample's answer with the method (null: full cache) and returns its record; a sample
// with choices has each choice's log-likelihood recorded instead, and its score from them. With a
// capture, the sample's shared prefill is reused (the record is the same as without, times aside).
nlohmann::json run_cell(const ModelFile& model, const Tokenizer& tok, Engine& engine, const Task& task,
                        const Sample& sample, Method* method, KvBudget budget, const nlohmann::json& config,
                        const PrefillCapture* capture = nullptr);

// A cell of a sample: its method (null: full cache), KV budget and configuration (its record's).
struct CellRun {
  Method* method;
  KvBudget budget;
  const nlohmann::json* config;
};
// What became of a cell run with others: its record, or the error that stopped it; the seconds it
// took, its share of the steps decoded together included.
struct CellOutcome {
  nlohmann::json record;
  std::string error;
  double seconds = 0;
};
// The cells of one generation sample decoded together (generate_batch): each begins its sequence in
// turn (from the capture, or its own prefill), then all decode in shared steps that read the weights
// once. Each record is the one run_cell makes (its generation identical), with its share of the
// decode time, the batch's peak memory and `decode_batch`, the number of cells that decoded together.
// A cell that fails to begin fails alone; a failed step fails the batch.
std::vector<CellOutcome> run_cells(const ModelFile& model, const Tokenizer& tok, Engine& engine, const Task& task,
                                   const Sample& sample, std::span<const CellRun> cells,
                                   const PrefillCapture* capture = nullptr);

// The code version compiled in (git describe at configure time).
const char* code_version();

}  // namespace kvb
