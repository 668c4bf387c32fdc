#include "methods/headkv/profile_prompts.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "harness/method/parts.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"
#include "harness/util/text_files.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

std::vector<Needle> builtin_reasoning_needles() {
  const std::string omar =
      "Omar's favorite thing is to build model sailboats in his garage and listen to old jazz records.";
  const std::string lena =
      "Lena's favorite thing is to paint watercolor landscapes by the river and drink a cup of mint tea afterward.";
  const std::string ages = " Omar is 34 years old. Lena is 29 years old.";
  // The answer sentence opens each needle without a leading space, so that it tokenizes in the prompt
  // as it does alone and the span search finds exactly it (a leading space changes the first token,
  // and the reference's ties-to-the-later-window rule then drifts onto the next sentence).
  return {
      {omar + " " + lena + ages, "What is the favorite thing of the older one between Omar and Lena?", omar, omar},
      {lena + " " + omar + ages, "What is the favorite thing of the younger one between Omar and Lena?", lena, lena}};
}

std::vector<Needle> builtin_retrieval_needles() {
  return {
      {"The secret ingredient in Grandma Rosa's lemon cake is a spoonful of lavender honey folded into the batter.",
       "What is the secret ingredient in Grandma Rosa's lemon cake?",
       "a spoonful of lavender honey folded into the batter.", ""},
      {"The old lighthouse on Gull Island was repainted bright green in the spring of 1987 by a crew of volunteers.",
       "What happened to the old lighthouse on Gull Island?",
       "repainted bright green in the spring of 1987 by a crew of volunteers.", ""},
      {"Captain Ortega never sails on a Friday because a storm once sank his first boat on a Friday morning.",
       "Why does Captain Ortega never sail on a Friday?",
       "because a storm once sank his first boat on a Friday morning.", ""}};
}

std::vector<Needle> load_needles(const std::string& path, bool with_answer) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot read the needle file", path);
  std::vector<Needle> out;
  for_each_json_line(in, path, [&](const nlohmann::json& j, int no) {
    Needle n;
    for (auto [field, into] : {std::pair{"needle", &n.needle},
                               {"question", &n.question},
                               {"real_needle", &n.real_needle},
                               {"answer", &n.answer}}) {
      if (!with_answer && into == &n.answer) continue;
      if (!j.contains(field) || !j[field].is_string()) fail("{}:{}: field '{}' must be a string", path, no, field);
      *into = j[field].get<std::string>();
    }
    out.push_back(std::move(n));
    return true;
  });
  if (out.empty()) fail("{}: no needles", path);
  return out;
}

std::string read_haystack(const std::string& spec, const std::string& data_dir, size_t words, std::string& described) {
  std::string text;
  if (spec.empty()) {
    const Essays e = read_essays(data_dir, "calibrate headkv");
    text = e.text;
    described = fmt::format("{} Paul Graham essays of the NIAH haystack ({}/PaulGrahamEssays)", e.files, data_dir);
  } else {
    for (const auto& t : read_text_files(spec, "haystack")) text += t;
    described = spec;
  }
  if (python_split(text).empty()) fail("the haystack '{}' holds no words", described);
  std::string hay = text;
  while (python_split(hay).size() < words) hay += text;
  return hay;
}

namespace {

// Python's seq[:k], negative k counting from the end.
std::vector<int32_t> py_head(const std::vector<int32_t>& v, long k) {
  const long n = static_cast<long>(v.size());
  const long keep = k >= 0 ? std::min(k, n) : std::max(0L, n + k);
  return {v.begin(), v.begin() + keep};
}

}  // namespace

NeedlePrompts::NeedlePrompts(const Tokenizer& tok) : tok_(tok) {
  for (int32_t id = 0; id < tok_.vocab_size(); ++id) {
    const std::string t = tok_.token_text(id);
    if (t == "." || t == "\xC4\xA0." || t == "\xE2\x96\x81.") periods_.insert(id);  // ".", "Ġ.", "▁."
  }
  adds_bos_ = !tok_.encode_prompt("").empty();
}

std::string NeedlePrompts::trimmed(const std::string& hay, int length) const {
  const auto t = tok_.encode_prompt(hay);
  if (static_cast<int>(t.size()) <= length) return hay;
  return tok_.decode(std::span(t).first(static_cast<size_t>(std::max(0, length))), false);
}

std::string NeedlePrompts::prompt_text(const std::string& context, const Needle& n, int length, int depth) const {
  const auto tn = tok_.encode_prompt(n.needle);
  auto tc = tok_.encode_prompt(context);
  const long room = length - 200;  // final_context_length_buffer
  if (static_cast<long>(tc.size() + tn.size()) > room) tc = py_head(tc, room - static_cast<long>(tn.size()));
  std::vector<int32_t> ids;
  if (depth == 100) {
    ids = tc;
    ids.insert(ids.end(), tn.begin(), tn.end());
  } else {
    auto p = static_cast<size_t>(static_cast<double>(tc.size()) * (depth / 100.0));
    while (p > 0 && !periods_.count(tc[p - 1])) --p;
    ids.assign(tc.begin(), tc.begin() + static_cast<std::ptrdiff_t>(p));
    ids.insert(ids.end(), tn.begin(), tn.end());
    ids.insert(ids.end(), tc.begin() + static_cast<std::ptrdiff_t>(p), tc.end());
  }
  return tok_.decode(ids, false) + "Based on the content of the book, Question: " + n.question + "\nAnswer:";
}

std::pair<int, int> NeedlePrompts::span(const std::vector<int32_t>& ids, const std::string& real_needle) const {
  const auto needle = tok_.encode(real_needle);
  const std::set<int32_t> want(needle.begin(), needle.end());
  if (want.empty()) fail("the answer sentence '{}' has no tokens", real_needle);
  const int n = static_cast<int>(needle.size()), N = static_cast<int>(ids.size());
  double best = 0;
  std::pair<int, int> out{0, 0};
  const auto bos = tok_.special().bos;
  for (int i = 0; i < N; ++i) {
    int start = i;
    if (adds_bos_) {
      if (!bos || ids[i] != *bos) continue;
      start = i + 1;
    }
    const std::set<int32_t> got(ids.begin() + start, ids.begin() + std::min(N, start + n));
    size_t common = 0;
    for (int32_t t : got) common += want.count(t);
    const double overlap = static_cast<double>(common) / static_cast<double>(want.size());
    if (overlap >= best) {
      best = overlap;
      out = {start, start + n};
    }
  }
  return out;
}

std::pair<int, int> NeedlePrompts::first_span(const std::vector<int32_t>& ids, const std::string& real_needle,
                                              double min_overlap) const {
  const auto needle = tok_.encode(real_needle);
  const std::set<int32_t> want(needle.begin(), needle.end());
  if (want.empty()) fail("the answer text '{}' has no tokens", real_needle);
  const int n = static_cast<int>(needle.size()), N = static_cast<int>(ids.size());
  for (int i = 0; i < N; ++i) {
    const std::set<int32_t> got(ids.begin() + i, ids.begin() + std::min(N, i + n));
    size_t common = 0;
    for (int32_t t : got) common += want.count(t);
    if (static_cast<double>(common) / static_cast<double>(want.size()) > min_overlap) return {i, i + n};
  }
  return {-1, -1};
}

RetrievalProbe::RetrievalProbe(int layers, int heads, int start, int end, ProbeRule rule, std::vector<int32_t> prompt)
    : score(layers, std::vector<double>(heads, 0.0)),
      start_(start),
      end_(end),
      rule_(rule),
      prompt_(std::move(prompt)),
      top1_(layers, std::vector<int32_t>(heads, -1)) {}

void RetrievalProbe::on_layer(const PrefillView& v, LayerCache& cache) { cache = keep_all(v, GqaMode::Native); }

void RetrievalProbe::on_decode(int layer, LayerCache& cache, const float* q, int32_t) {
  const int d = cache.head_dim(), k = end_ - start_;
  if (k <= 0) return;
  for (int h = 0; h < cache.n_query_heads(); ++h) {
    std::vector<float> p;
    std::vector<int32_t> pos;
    for (const auto& seg : std::as_const(cache).segments(cache.cache_head_of(h))) {
      const size_t n0 = p.size();
      p.resize(n0 + seg->size());
      seg->logits(q + size_t(h) * d, p.data() + n0);
      pos.insert(pos.end(), seg->positions().begin(), seg->positions().end());
    }
    for (auto& x : p) x /= std::sqrt(static_cast<float>(d));
    if (rule_ == ProbeRule::Copy) {  // softmax keeps the order: the top-1 of the logits (ties: lowest)
      top1_[layer][h] = pos[static_cast<size_t>(std::max_element(p.begin(), p.end()) - p.begin())];
      continue;
    }
    softmax_inplace(p.data(), static_cast<int>(p.size()));
    // torch.topk of the row; ties (unspecified there) to the lower position.
    std::vector<int> idx(p.size());
    std::iota(idx.begin(), idx.end(), 0);
    const int top = std::min<int>(k, static_cast<int>(idx.size()));
    std::nth_element(idx.begin(), idx.begin() + top - 1, idx.end(),
                     [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int i = 0; i < top; ++i)
      if (pos[idx[i]] >= start_ && pos[idx[i]] < end_) score[layer][h] += double(p[idx[i]]) / k;
  }
}

void RetrievalProbe::generated(int32_t token) {
  if (rule_ != ProbeRule::Copy || end_ <= start_) return;
  for (size_t l = 0; l < top1_.size(); ++l)
    for (size_t h = 0; h < top1_[l].size(); ++h) {
      const int32_t i = top1_[l][h];
      if (i >= start_ && i < end_ && static_cast<size_t>(i) < prompt_.size() &&
          prompt_[static_cast<size_t>(i)] == token)
        score[l][h] += 1.0 / (end_ - start_);
      top1_[l][h] = -1;
    }
}

}  // namespace kvb
