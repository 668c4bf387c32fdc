#pragma once
// Benchmarks as tasks: a task produces samples (the model input, reference answers, decoding limits,
// metadata such as context length and needle depth) deterministically for a given tokenizer, and
// scores a prediction with the benchmark's own metric. Tasks register by name from their own file,
// like methods, so that a new benchmark is one file.
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness/util/params.hpp"

namespace kvb {

class Tokenizer;

// A prompt in kvpress's three parts (its pipeline): `context` is prefilled inside the user turn and
// compressed; `question` closes the user turn and `answer_prefix` follows the assistant header, both
// fed after compression and kept whole.
struct PromptSplit {
  std::string context, question, answer_prefix;
  int max_context = 0;  // > 0: the prefill (chat template head + context) cut to its first this many tokens
};

// A multiple-choice sample, as lm-evaluation-harness scores one by log-likelihood: each choice is a
// context and a continuation, scored by the log-probability of the continuation's tokens after the
// context's, read through the cache the method kept of the context. Nothing is generated.
struct Choice {
  std::string context, continuation;
  std::string text;  // the choice as the benchmark lists it: acc_norm divides by its length in characters
};
struct Choices {
  std::vector<Choice> options;
  size_t gold = 0;
  // Contexts start with BOS where the tokenizer adds one (lm-eval's add_bos_token); otherwise bare.
  bool bos = false;
  // The sample's score: "acc" (the most likely choice is the gold one) or "acc_norm" (the same with
  // each log-likelihood divided by the choice's length).
  std::string metric = "acc";
  bool acc_norm = true;  // whether lm-eval scores the benchmark by acc_norm too (not Winogrande's partial scoring)
};

// A window of a text scored by its own next-token log-likelihoods (perplexity): the first `compress_at`
// tokens are prefilled and compressed by the method, the rest fed one at a time over the kept cache,
// each token predicted from what the cache holds. 0: the whole window in one prefill (the method then
// changes the numbers only if it changes the model, as DynaKV's transform does).
struct ScoredText {
  std::vector<int32_t> ids;
  int compress_at = 0;
};

struct Sample {
  std::string id;      // unique within the task, stable across runs (results are keyed by it)
  std::string prompt;  // the model input text
  bool chat = false;   // whether the protocol wraps the prompt in the model's chat template
  std::vector<std::string> answers;
  int max_new_tokens = 0;
  int min_new_tokens = 0;         // end-of-generation tokens are masked before this many
  std::vector<std::string> stop;  // stop strings (the text is cut before the first)
  // Texts whose token ends generation as an end-of-generation token does, masked alike before
  // min_new_tokens: LongBench's pred.py adds encode(text)[-1] to eos_token_id (samsum's "\n").
  std::vector<std::string> end_texts;
  nlohmann::json meta;  // length, depth, category, ...
  // Set under protocol=kvpress or kvpress-query-aware: the runner prefills split->context and feeds
  // the rest after compression (`prompt` is then the three parts joined, for display).
  std::optional<PromptSplit> split;
  // Set by a multiple-choice task: the choices are scored instead of a generation (prompt, answers
  // and the decoding limits then only describe the sample).
  std::optional<Choices> choices;
  // Set by a perplexity task: the window's mean negative log-likelihood per predicted token is the
  // sample's score (reports print exp of the mean, TaskLayout::perplexity).
  std::optional<ScoredText> scored_text;
};

// The `protocol` option of a task whose samples split into context and question:
//   native               the benchmark's own prompt, prefilled and compressed whole (the default);
//   kvpress              kvpress's pipeline: the context compressed, the question after compression;
//   kvpress-query-aware  kvpress's query_aware: the question compressed with the context, the answer
//                        prefix after compression.
// Both kvpress protocols render the chat template on every prompt (thinking off), as kvpress does.
ParamSpec protocol_option();
// `max_context`: kvpress's max_context_length under a kvpress protocol (0, the default: none, as kvpress
// with a model whose window holds the prompt).
ParamSpec max_context_option();
struct Protocol {
  std::string name = "native";
  int max_context = 0;
};
// The two options as a task declared them.
Protocol protocol_from(const Params& p);
// Applies `protocol` to a sample whose parts the task gives (native: the sample is left as it is).
void apply_protocol(Sample& s, const Protocol& protocol, std::string context, std::string question,
                    std::string answer_prefix);

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
  // Score of one prediction in [0, 1] as the benchmark defines it (a sample with choices is scored by
  // its Choices::metric instead).
  virtual double score(const Sample& sample, const std::string& prediction) const = 0;
};

// A prediction made anywhere (another harness, an API) to score with a benchmark's own metric:
// `variant` is the part of the benchmark with its own metric (a LongBench dataset, a RULER task; empty
// for a benchmark with one), `all_classes` what LongBench's classification datasets are scored against,
// `data_dir` where the metric's tables are (jieba's, for the Chinese datasets).
struct PredictionToScore {
  std::string variant = {};
  std::string prediction = {};
  std::vector<std::string> answers = {}, all_classes = {};
  std::string data_dir = {};
};

// How `kvbench report` lays out a task's records beside its generic tables: the papers' tables are data
// the task declares, so that a benchmark brings its layout with it.
struct ReportColumn {
  std::string key = {};    // a value of the layout's column option ("qasper")
  std::string name = {};   // its short name in tables ("Qasper")
  std::string group = {};  // a heading over adjacent columns ("Single-Doc QA")
};
// How a benchmark's own script turns its samples' scores into the percent it rounds to 2 decimals; the
// order of the operations decides a rounding tie (21.75 / 40: RULER's 54.37, eval.py's 54.38).
enum class PercentRule {
  MeanTimes100,     // sum / n * 100, the sum in order (RULER's string_match_*, lm-eval's means)
  HundredTimesSum,  // 100 * sum / n (LongBench's eval.py)
  NumpyMean,        // 100 * np.mean(scores), numpy summing pairwise (LongBench-E's eval.py --e)
};
double benchmark_percent(std::span<const double> scores, PercentRule rule);

struct TaskLayout {
  std::string title = {};                  // the paper table's caption; empty: the generic tables only
  std::string column_option = {};          // the option whose values are the paper table's columns
  std::string default_column = {};         // its value where a record's options leave it out
  std::vector<ReportColumn> columns = {};  // in the papers' order
  // Under the paper table; {shown} is the number of columns with results, {left_out} a remark when
  // that is fewer than all.
  std::string note = {};
  bool nulls = false;  // a column counting empty predictions (RULER's rule: control characters count as space)
  // One paper table per value of this option (RULER's context length), and a table of the mean over
  // columns per value; `length_default` where a record leaves it out.
  std::string length_option = {}, length_default = {};
  // Or ranges of the records' own meta.length (LongBench-E's buckets): name, [from, to).
  std::vector<std::pair<std::string, std::pair<int, int>>> length_ranges = {};
  bool depth_heatmap = false;  // a depth x length heatmap per configuration, from meta.depth and meta.length
  // Options that split one configuration into runs (a grid's parts), pooled into one summary row.
  std::vector<std::string> pooled_options = {};
  // Scores are mean negative log-likelihoods per token (natural log) of equal-length windows: tables
  // print the perplexity exp(mean) (lower is better), intervals and differences mapped through exp.
  bool perplexity = false;
  // The paper table ends with the mean over its columns (false where the columns are other scores of the
  // same samples, as GSM8K's two filters).
  bool average = true;
  PercentRule percent = PercentRule::MeanTimes100;  // a column's score from its samples'
};

struct TaskInfo {
  std::string name = {};
  std::string summary = {};
  std::vector<ParamSpec> options = {};
  std::function<std::unique_ptr<Task>(const TaskContext&, const Params&)> make = {};
  // Its score in [0, 1] of a prediction made outside kvbench (kvbench score, Python's score_each);
  // empty for a task that scores only the samples it made.
  std::function<double(const PredictionToScore&)> score_prediction = {};
  // The option whose choices are the VARIANTs score_prediction takes (`kvbench score --task
  // ruler/niah_single_1`: the option `task`), checked before any prediction is read; empty: the task
  // takes no variant.
  std::string score_variant_option = {};
  TaskLayout layout = {};
  // Options that change only how a generated text is scored (GSM8K's filter): task variants differing in
  // nothing else share one generation per sample and configuration, the later ones scoring it again.
  std::vector<std::string> scoring_options = {};
};

class TaskRegistry {
 public:
  static TaskRegistry& get();
  void add(TaskInfo info);
  const TaskInfo& info(const std::string& name) const;  // Error listing the tasks if unknown
  const TaskInfo* find(const std::string& name) const;  // null if unknown
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

// The benchmark's score of one prediction, the task named "TASK/VARIANT" or "TASK" (longbench/qasper,
// ruler/niah_single_1, niah). Errors name the task and say which tasks can score outside a run.
double score_prediction(const std::string& task_variant, PredictionToScore p);

// Predictions in LongBench's pred/ layout, one JSON object per line with "pred", "answers" and, where
// the benchmark needs them, "all_classes" and "length", scored as LongBench's eval.py does: the mean
// x 100 rounded to 2 decimals; with `by_length` (LongBench-E's scorer_e) also one such score per length
// range "0-4k" (length < 4000), "4-8k" (< 8000) and "8k+" (NaN for a range without lines). Errors name
// the file, the line and the field.
struct PredictionScores {
  size_t lines = 0;
  double score = 0;
  std::vector<std::pair<std::string, double>> ranges;
};
PredictionScores score_predictions_file(const std::string& task_variant, const std::string& path, bool by_length,
                                        const std::string& data_dir);

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
