#pragma once
// LongBench v1 metrics, defined as the official metrics.py computes them:
// SQuAD-style normalisation and token F1, ROUGE-L of the `rouge` 1.0.1 package, classification,
// passage count and retrieval, fuzzywuzzy's ratio for code, and the Chinese variants on jieba's
// segments. Scores are in [0, 1].
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvb::longbench {

class Jieba;

std::string normalize_answer(std::string_view s);
double qa_f1(std::string_view prediction, std::string_view reference);
// 0 where the package's recursive LCS walk overflows Python's stack as it does under eval.py (a path
// of about 990 words between a reference sentence and a prediction sentence), as metrics.py scores it.
double rouge_l(std::string_view prediction, std::string_view reference);
// normalize_zh_answer: lower, drop string.punctuation and metrics.py's Chinese punctuation, drop
// whitespace.
std::string normalize_zh_answer(std::string_view s);
// Token F1 over the normalised jieba segments (empty ones dropped).
double qa_f1_zh(std::string_view prediction, std::string_view reference, const Jieba& jieba);
// ROUGE-L of the jieba segments joined by single spaces.
double rouge_zh(std::string_view prediction, std::string_view reference, const Jieba& jieba);
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
// The Chinese metrics need `jieba`; Error naming the dataset if it is null for them.
double score(const std::string& dataset, std::string_view prediction, const std::vector<std::string>& answers,
             const std::vector<std::string>& all_classes, const Jieba* jieba = nullptr);

}  // namespace kvb::longbench
