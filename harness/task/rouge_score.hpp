#pragma once
// ROUGE as Google's `rouge_score` package (0.1.2) computes it with use_stemmer=True, the metric of
// retrieval-head detection (Wu et al.; HeadKV-R profiling): lowercase, every run of characters outside
// [a-z0-9] is a separator, words longer than 3 characters are Porter-stemmed (NLTK's PorterStemmer in
// its default NLTK_EXTENSIONS mode), n-grams are counted with multiplicity.
#include <string>
#include <string_view>
#include <vector>

namespace kvb {

// nltk.stem.porter.PorterStemmer().stem(word) for a lowercase ASCII word.
std::string porter_stem(std::string_view word);

// rouge_score.tokenize.tokenize(text, PorterStemmer()).
std::vector<std::string> rouge_tokens(std::string_view text);

struct RougeScore {
  double precision = 0, recall = 0, fmeasure = 0;
};
// RougeScorer(['rouge{n}'], use_stemmer=True).score(target, prediction)['rouge{n}'].
RougeScore rouge_n(std::string_view target, std::string_view prediction, int n = 1);

}  // namespace kvb
