#include "harness/task/jieba.hpp"

#include <utf8proc.h>

#include <array>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "harness/util/error.hpp"

namespace kvb::longbench {
namespace {

constexpr double kMinFloat = -3.14e100;  // finalseg's MIN_FLOAT for unseen emissions and transitions
constexpr char kStates[4] = {'B', 'M', 'E', 'S'};
constexpr uint32_t kInvalid = 0xFFFFFFFFu;  // an invalid UTF-8 byte, a non-Han character of its own

int state_index(const std::string& name, const std::string& path) {
  for (int s = 0; s < 4; ++s)
    if (name.size() == 1 && name[0] == kStates[s]) return s;
  fail("{}: state '{}' is not one of B, M, E, S", path, name);
}

bool ascii_alnum(uint32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool han(uint32_t c) { return c >= 0x4E00 && c <= 0x9FD5; }

// jieba's re_han_default class: the characters cut on the dictionary.
bool dict_char(uint32_t c) {
  return han(c) || ascii_alnum(c) || c == '+' || c == '#' || c == '&' || c == '.' || c == '_' || c == '%' || c == '-';
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: not found; run scripts/setup.sh (it writes jieba 0.42.1's tables there)", path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not JSON ({}); rerun scripts/setup.sh after deleting the file", path, e.what());
  }
}

}  // namespace

// The sentence as code points with their byte offsets, so that segments are cut from the original
// bytes (offsets has one entry more than cps: the end).
struct Jieba::Text {
  std::string_view s;
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;

  explicit Text(std::string_view str) : s(str) {
    for (size_t i = 0; i < s.size();) {
      offsets.push_back(i);
      utf8proc_int32_t cp = -1;
      const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                      static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
      cps.push_back(n <= 0 ? kInvalid : static_cast<uint32_t>(cp));
      i += n <= 0 ? 1 : static_cast<size_t>(n);
    }
    offsets.push_back(s.size());
  }
  std::string_view sub(size_t b, size_t e) const { return s.substr(offsets[b], offsets[e] - offsets[b]); }
};

const Jieba& Jieba::load(const std::string& data_dir) {
  static std::mutex m;
  static std::map<std::string, std::unique_ptr<Jieba>> cache;
  const std::lock_guard lock(m);
  auto& j = cache[data_dir];
  if (!j) j.reset(new Jieba(data_dir + "/jieba"));
  return *j;
}

Jieba::Jieba(const std::string& dir) {
  const std::string dict = dir + "/dict.txt";
  std::ifstream in(dict);
  if (!in) fail("{}: not found; run scripts/setup.sh (it fetches jieba 0.42.1's dictionary)", dict);
  int64_t total = 0;
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    // gen_pfdict: strip ASCII whitespace, then "word freq [tag]" split on single spaces; a later entry
    // of the same word replaces the earlier one, and every entry counts towards the total.
    constexpr const char* ws = " \t\n\r\v\f";
    const size_t b = line.find_first_not_of(ws);
    const std::string_view l = b == std::string::npos
                                   ? std::string_view()
                                   : std::string_view(line).substr(b, line.find_last_not_of(ws) + 1 - b);
    const size_t sp = l.find(' ');
    const std::string_view word = l.substr(0, sp);
    const std::string_view f = sp == std::string_view::npos ? "" : l.substr(sp + 1, l.find(' ', sp + 1) - sp - 1);
    int64_t n = 0;
    const auto [end, ec] = std::from_chars(f.data(), f.data() + f.size(), n);
    if (f.empty() || ec != std::errc() || end != f.data() + f.size())
      fail("{}:{}: expected 'word frequency [tag]', got '{}'", dict, no, l);
    freq_.insert_or_assign(std::string(word), n);
    total += n;
    const Text t(word);
    for (size_t k = 1; k < t.cps.size(); ++k) freq_.try_emplace(std::string(t.sub(0, k)), 0);
  }
  if (freq_.empty()) fail("{}: no words", dict);
  log_total_ = std::log(static_cast<double>(total));

  const nlohmann::json start = read_json(dir + "/prob_start.json"), trans = read_json(dir + "/prob_trans.json"),
                       emit = read_json(dir + "/prob_emit.json");
  try {
    for (int s = 0; s < 4; ++s) {
      start_[s] = kMinFloat;
      for (int t = 0; t < 4; ++t) trans_[s][t] = kMinFloat;
    }
    for (const auto& [k, v] : start.items()) start_[state_index(k, dir + "/prob_start.json")] = v.get<double>();
    for (const auto& [k, row] : trans.items())
      for (const auto& [k2, v] : row.items())
        trans_[state_index(k, dir + "/prob_trans.json")][state_index(k2, dir + "/prob_trans.json")] = v.get<double>();
    for (const auto& [k, row] : emit.items()) {
      auto& table = emit_[state_index(k, dir + "/prob_emit.json")];
      for (const auto& [ch, v] : row.items()) {
        const Text t(ch);
        if (t.cps.size() != 1) fail("{}/prob_emit.json: key '{}' of state {} is not one character", dir, ch, k);
        table[t.cps[0]] = v.get<double>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the HMM tables must map states to numbers or to objects of numbers ({})", dir, e.what());
  }
}

int64_t Jieba::freq(std::string_view word) const {
  const auto it = freq_.find(word);
  return it == freq_.end() ? 0 : it->second;
}

std::vector<std::string> Jieba::cut(std::string_view sentence) const {
  const Text t(sentence);
  std::vector<std::string> out;
  const size_t n = t.cps.size();
  for (size_t i = 0; i < n;) {
    if (dict_char(t.cps[i])) {
      size_t j = i;
      while (j < n && dict_char(t.cps[j])) ++j;
      cut_dag(t, i, j, out);
      i = j;
    } else {
      // Outside the dictionary blocks re_skip_default splits off "\r\n" and single whitespace characters,
      // and cut() yields the rest character by character: every character is a segment but "\r\n".
      const size_t len = t.cps[i] == '\r' && i + 1 < n && t.cps[i + 1] == '\n' ? 2 : 1;
      out.emplace_back(t.sub(i, i + len));
      i += len;
    }
  }
  return out;
}

void Jieba::cut_dag(const Text& t, size_t b, size_t e, std::vector<std::string>& out) const {
  const size_t n = e - b;
  // dag[k]: the ends (inclusive) of the dictionary words starting at k, or k alone; walking stops at
  // the first fragment that is not even a prefix.
  std::vector<std::vector<size_t>> dag(n);
  for (size_t k = 0; k < n; ++k) {
    for (size_t i = k; i < n; ++i) {
      const auto it = freq_.find(t.sub(b + k, b + i + 1));
      if (it == freq_.end()) break;
      if (it->second) dag[k].push_back(i);
    }
    if (dag[k].empty()) dag[k].push_back(k);
  }
  // route[k] = max over x of (log(freq or 1) - log(total) + route[x+1], x): Python's max over tuples,
  // so equal probabilities go to the larger x (the ends are ascending, hence >=).
  std::vector<std::pair<double, size_t>> route(n + 1, {0.0, 0});
  for (size_t k = n; k-- > 0;) {
    bool first = true;
    for (size_t x : dag[k]) {
      const int64_t f = freq(t.sub(b + k, b + x + 1));
      const double p = std::log(static_cast<double>(f ? f : 1)) - log_total_ + route[x + 1].first;
      if (first || p >= route[k].first) route[k] = {p, x};
      first = false;
    }
  }
  // Single characters are gathered; a gathered run that is not a word goes through the HMM.
  size_t buf = 0, buf_len = 0;
  auto flush = [&] {
    if (buf_len == 1) {
      out.emplace_back(t.sub(b + buf, b + buf + 1));
    } else if (buf_len > 1) {
      if (!freq(t.sub(b + buf, b + buf + buf_len)))
        cut_hmm(t, b + buf, b + buf + buf_len, out);
      else
        for (size_t c = buf; c < buf + buf_len; ++c) out.emplace_back(t.sub(b + c, b + c + 1));
    }
    buf_len = 0;
  };
  for (size_t x = 0; x < n;) {
    const size_t y = route[x].second + 1;
    if (y - x == 1) {
      if (!buf_len) buf = x;
      ++buf_len;
    } else {
      flush();
      out.emplace_back(t.sub(b + x, b + y));
    }
    x = y;
  }
  flush();
}

void Jieba::cut_hmm(const Text& t, size_t b, size_t e, std::vector<std::string>& out) const {
  // finalseg.cut: Han runs through Viterbi; elsewhere re_skip ([a-zA-Z0-9]+(?:\.\d+)?%?) matches and
  // the text between matches are the segments (inside a dictionary block \d can only be ASCII).
  for (size_t i = b; i < e;) {
    if (han(t.cps[i])) {
      size_t j = i;
      while (j < e && han(t.cps[j])) ++j;
      viterbi(t, i, j, out);
      i = j;
      continue;
    }
    size_t gap = i;
    while (i < e && !han(t.cps[i])) {
      if (!ascii_alnum(t.cps[i])) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < e && ascii_alnum(t.cps[j])) ++j;
      if (j + 1 < e && t.cps[j] == '.' && t.cps[j + 1] >= '0' && t.cps[j + 1] <= '9') {
        ++j;
        while (j < e && t.cps[j] >= '0' && t.cps[j] <= '9') ++j;
      }
      if (j < e && t.cps[j] == '%') ++j;
      if (gap < i) out.emplace_back(t.sub(gap, i));
      out.emplace_back(t.sub(i, j));
      gap = i = j;
    }
    if (gap < i) out.emplace_back(t.sub(gap, i));
  }
}

void Jieba::viterbi(const Text& t, size_t b, size_t e, std::vector<std::string>& out) const {
  enum { B, M, E, S };
  // Predecessors of each state (finalseg's PrevStatus); ties go to the later state name, as Python's
  // max over (probability, state) tuples does.
  static constexpr int prev[4][2] = {{E, S}, {M, B}, {B, M}, {S, E}};
  const size_t n = e - b;
  auto emit = [&](int s, size_t i) {
    const auto it = emit_[s].find(t.cps[i]);
    return it == emit_[s].end() ? kMinFloat : it->second;
  };
  std::vector<std::array<double, 4>> v(n);
  std::vector<std::array<int, 4>> back(n);
  for (int s = 0; s < 4; ++s) v[0][s] = start_[s] + emit(s, b);
  for (size_t i = 1; i < n; ++i)
    for (int s = 0; s < 4; ++s) {
      const double em = emit(s, b + i);
      int best = -1;
      double bp = 0;
      for (int p : prev[s]) {
        const double cand = v[i - 1][p] + trans_[p][s] + em;
        if (best < 0 || cand > bp || (cand == bp && kStates[p] > kStates[best])) {
          best = p;
          bp = cand;
        }
      }
      v[i][s] = bp;
      back[i][s] = best;
    }
  std::vector<int> path(n);
  path[n - 1] = v[n - 1][S] >= v[n - 1][E] ? S : E;
  for (size_t i = n - 1; i > 0; --i) path[i - 1] = back[i][path[i]];
  // Segments end at E (from the last B) and at S; trailing characters after the last end form one.
  size_t begin = 0, next = 0;
  for (size_t i = 0; i < n; ++i) {
    if (path[i] == B) {
      begin = i;
    } else if (path[i] == E) {
      out.emplace_back(t.sub(b + begin, b + i + 1));
      next = i + 1;
    } else if (path[i] == S) {
      out.emplace_back(t.sub(b + i, b + i + 1));
      next = i + 1;
    }
  }
  if (next < n) out.emplace_back(t.sub(b + next, e));
}

}  // namespace kvb::longbench
