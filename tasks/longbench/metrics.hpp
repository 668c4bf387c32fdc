#pragma once
// LongBench v1 metrics, defined as the official metrics.py computes them (spec/benchmarks.md 1.6):
// SQuAD-style normalisation and token F1, ROUGE-L of the `rouge` 1.0.1 package, classification,
// passage count and retrieval, and fuzzywuzzy's ratio for code. Scores are in [0, 1].
#include <string>
#include <string_view>
#include <vector>

namespace kvb::longbench {

std::string normalize_answer(std::string_view s);
double qa_f1(std::string_view prediction, std::string_view reference);
double rouge_l(std::string_view prediction, std::string_view reference);
double classification(std::string_view prediction, std::string_view reference,
                      const std::vector<std::string>& all_classes);
double count(std::string_view prediction, std::string_view reference);
// `chinese`: the id is found by 段落(\d+) instead of Paragraph (\d+).
double retrieval(std::string_view prediction, std::string_view reference, bool chinese);
// fuzz.ratio with python-Levenshtein installed (InDel similarity on code points), / 100.
double code_sim(std::string_view prediction, std::string_view reference);

// pred.lstrip('\n').split('\n')[0]: the first-line rule of trec, triviaqa, samsum and lsht.
std::string first_line(std::string_view prediction);

// The metric of a LongBench dataset ("qa_f1", "rouge", ...); Error naming the dataset if unknown.
std::string metric_of(const std::string& dataset);
// Score of one prediction: the metric against every answer, the maximum (first-line rule applied).
double score(const std::string& dataset, std::string_view prediction, const std::vector<std::string>& answers,
             const std::vector<std::string>& all_classes);

}  // namespace kvb::longbench
