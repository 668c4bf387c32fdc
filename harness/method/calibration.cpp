#include "harness/method/calibration.hpp"

#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"

namespace kvb {

std::vector<std::vector<int32_t>> token_sequences(const Tokenizer& tok, const std::vector<std::string>& docs, int len,
                                                  size_t tokens) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> cur;
  const auto bos = tok.special().bos;
  size_t total = 0;
  for (const auto& d : docs) {
    for (int32_t t : tok.encode(d + "\n\n", false)) {
      if (cur.empty() && bos) cur.push_back(*bos);
      cur.push_back(t);
      if (static_cast<int>(cur.size()) == len) {
        total += cur.size();
        out.push_back(std::move(cur));
        cur.clear();
        if (total >= tokens) return out;
      }
    }
  }
  if (cur.size() > 1 && total < tokens) out.push_back(std::move(cur));
  return out;
}

SplitDocuments split_held_out(const std::vector<std::string>& docs, long every, const std::string& command,
                              const std::string& hint) {
  SplitDocuments s;
  for (size_t i = 0; i < docs.size(); ++i)
    (static_cast<long>(i % size_t(every)) == every - 1 ? s.held : s.fit).push_back(docs[i]);
  if (s.fit.empty() || s.held.empty())
    fail("{}: {} document(s) cannot be split into fitting and held-out text (every {}th is held out); {}", command,
         docs.size(), every, hint);
  return s;
}

}  // namespace kvb
