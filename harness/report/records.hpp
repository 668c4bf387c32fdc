#pragma once
// The records behind a report: every record of the results files, deduplicated, reduced to what the
// tables group by (entries) and pooled by configuration (groups), with the rows' method labels.
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "harness/method/method.hpp"
#include "harness/report/stats.hpp"
#include "harness/task/task.hpp"

namespace kvb::report {

using nlohmann::json;

struct Group {
  json config;
  double score = 0, kv_share = 0, fp16_share = 0, t_eq = 0;
  int n = 0;
  std::map<std::pair<int, int>, std::pair<double, int>> depth_length;  // (depth, length) -> sum, count
  std::map<std::string, std::vector<double>> strata;  // scores by RULER task or LongBench dataset ("" else)
  // The parameters that tell it from the method's other settings in the records ("recency=50"), if any.
  std::string distinct;
};

// One record, reduced to what the tables group by.
struct Entry {
  std::string task, method, label, variant;  // variant: the task option a paper table has columns for
  std::string unit;                          // the sample it scored (sample_unit)
  std::string setting;                       // the parameters and GQA mode (and context where it varies), as text
  json params;                               // the method's parameters, as recorded
  std::string gqa;                           // the GQA mode ("-": none)
  // What else the run was made with (run_context): set apart in the label where it varies.
  json context;
  std::string dtype;  // the cache's KV dtype
  std::string model;  // the model file's name
  KvBudget budget;
  int length = 0;
  double score = 0, kv_share = 1;
  double fp16_share = 0.5;  // kept bytes against a full fp16 cache of the prompt (the papers' unit)
  double bits = 8;          // kept bits per K/V element of the prompt: 16 x fp16_share
  bool empty = false;
  Group* group = nullptr;
};

// Every record of the files, deduplicated, as entries and their configurations' groups.
struct Records {
  std::map<std::string, Group> groups;  // by configuration, the grid's parts pooled
  std::vector<Entry> entries;           // one per record; each points into groups
  // (task, method) -> its distinct settings (parameters, GQA mode and varying context, as text) -> their
  // completed parameters
  std::map<std::pair<std::string, std::string>, std::map<std::string, json>> method_configs;
};

// Each record of the files once, in order: a cell recorded twice counts once, twice with different scores
// is an error naming both lines. So is a sample recorded in two runs whose configurations differ only in
// options that index the grid (NIAH's depths, RULER's samples): those runs pool, and a sample is counted
// once. Says on stderr how many records were repeats.
void for_each_distinct_record(const std::vector<std::string>& files,
                              const std::function<void(const json&, const std::string& file, int line)>& fn);
// The records for_each_distinct_record gives; error when there are none.
Records read_records(const std::vector<std::string>& files);
// Each entry's row label: its method, with the parameters that tell its settings apart, and the
// context that does where one method's runs on one task differ in it (max_new_tokens, weights, a
// recalibrated artifact, a task option that is not a table column such as NIAH's chat).
void label_entries(Records& r);
// A record's score, checked against its task's scale: in [0, 1], or for a perplexity task a finite mean
// negative log-likelihood of at least 0. `where` names the record (FILE:LINE).
double record_score(const json& record, const std::string& where);
// A record's configuration as the tables pool it: options that only index the grid, and the version,
// left out.
json pooled_config(const json& record);
// The sample a record scored, as the bootstrap's unit: its task, the options but those that only change
// the scoring (GSM8K's metric: the same generation scored twice is one sample), model, KV dtype and id;
// "" for a record without an id.
std::string sample_unit(const json& record);
// Of a configuration: the fields besides task, options, method, parameters, GQA mode, budget, KV dtype
// and model (max_new_tokens, weights, model_fingerprint, artifacts), each as text (an artifact set as a
// digest).
json run_context(const json& config);
// run_context and the task options that are no table column, a record's or the task's default where
// the record leaves one out: what else tells two runs of a method on a task apart in a row's label.
json label_context(const json& config);
// Of runs, each a task, a method, the rest of its setting as text (parameters, GQA mode, dtype, model,
// budget) and its run_context: per run, the fields in which two runs of its method on its task that
// agree in the rest differ ("default" where a run lacks one); the others left out. (An artifact that
// comes with a parameter's value tells nothing the parameter does not; a recalibration does.)
struct RunContext {
  std::string task, method, setting;
  json context;
};
std::vector<json> varying_context(const std::vector<RunContext>& runs);
// A record's parameters with each one its method gained after the record was made (left out of keys
// at its earlier behaviour) set to that earlier value, so that settings compare by what they ran; as
// recorded for a method this build does not know. The GQA mode joins them where it is not "-".
json completed_params(const std::string& method, const json& params, const std::string& gqa);
// Per setting of one method (setting -> its completed parameters): the text that tells it from the
// method's other settings, the parameters whose values differ (all of them where none differs); empty
// for a method of one setting.
std::map<std::string, std::string> setting_texts(const std::map<std::string, json>& settings);
// A row's name: the method, its KV dtype where not fp32 ("snapkv [fp16]"), and the model where given
// (records of several models: "snapkv on Llama-3.1-8B.gguf").
std::string run_label(const std::string& method, const std::string& dtype, const std::string& model);
// The layout a task declares (harness/task/task.hpp); none for a task this build does not know.
const TaskLayout& layout_of(const std::string& task);
// How the task's scores print (perplexity tasks: exp of the mean NLL).
Scale scale_of(const std::string& task);
// Scores by the task's column (a stratum each), for the intervals.
std::vector<std::vector<double>> strata_of(const std::map<std::string, std::vector<double>>& by_variant);

}  // namespace kvb::report
