#pragma once
// jieba 0.42.1's precise mode, `jieba.cut(s, cut_all=False, HMM=True)`, the segmentation LongBench's
// Chinese metrics run on (LongBench metrics.py: qa_f1_zh_score and rouge_zh_score use jieba.cut): blocks of
// Han/ASCII-word characters are cut on the prefix dictionary's maximum-probability route, runs of unknown single
// characters go through the finalseg HMM, and every other character is a segment of its own ("\r\n" and whitespace
// included).
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvb::longbench {

class Jieba {
 public:
  // The tables scripts/setup.sh writes to <data_dir>/jieba/ (dict.txt, prob_{start,trans,emit}.json),
  // read once per process and directory; Error naming the missing file otherwise.
  static const Jieba& load(const std::string& data_dir);

  // The segments of a UTF-8 string, in order; they concatenate to the input.
  std::vector<std::string> cut(std::string_view sentence) const;

 private:
  explicit Jieba(const std::string& dir);
  struct Text;
  void cut_dag(const Text& t, size_t b, size_t e, std::vector<std::string>& out) const;
  void cut_hmm(const Text& t, size_t b, size_t e, std::vector<std::string>& out) const;
  void viterbi(const Text& t, size_t b, size_t e, std::vector<std::string>& out) const;
  int64_t freq(std::string_view word) const;  // 0 when absent, as FREQ.get(w) or 0

  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Every dictionary word with its frequency and every proper prefix of one (frequency 0 unless it is
  // a word itself): the prefix dictionary jieba builds.
  std::unordered_map<std::string, int64_t, Hash, std::equal_to<>> freq_;
  double log_total_ = 0;
  // HMM log-probabilities over the states B, M, E, S (this index order).
  double start_[4]{}, trans_[4][4]{};
  std::unordered_map<uint32_t, double> emit_[4];
};

}  // namespace kvb::longbench
