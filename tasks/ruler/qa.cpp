// RULER's qa_1 (SQuAD 2.0 dev) and qa_2 (HotpotQA dev, distractor setting):
// the question's gold paragraphs among distractor documents, as many as fit the target length,
// replayed call for call like RULER's qa.py (2025): the global generator draws the distractors, a
// fresh generator seeded with the task seed shuffles the documents of every build. The data files
// are the user's (RULER's download_qa_dataset.sh fetches them); kvbench never ships them.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "harness/util/error.hpp"
#include "tasks/ruler/ruler.hpp"

namespace kvb {
namespace {

constexpr const char* kTemplate =
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query} Answer:";
constexpr int kIncrement = 10;  // documents per step of the size search and of a sample's shrinking

struct Question {
  std::string query;
  std::vector<std::string> outputs;
  std::vector<size_t> gold, more;  // indices into the sorted documents; `more`: the article's other paragraphs
};

class Dataset {
 public:
  Dataset(const std::string& path, bool squad) : path_(path) {
    std::ifstream in(path);
    if (!in) fail("{}: not found", path);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: not JSON ({})", path, e.what());
    }
    squad ? read_squad(j) : read_hotpotqa(j);
    if (questions.empty()) fail("{}: no answerable questions", path);
  }

  std::vector<std::string> docs;
  std::vector<Question> questions;

 private:
  const nlohmann::json& field(const nlohmann::json& j, const char* key, bool (nlohmann::json::*is)() const noexcept,
                              const char* what, const std::string& where) const {
    if (!j.is_object() || !j.contains(key) || !(j[key].*is)())
      fail("{}: {}: field '{}' must be {}", path_, where, key, what);
    return j[key];
  }

  // Unique documents in Python's sorted order (code points, i.e. UTF-8 bytes), as upstream indexes them.
  size_t index_of(const std::string& d) const {
    return static_cast<size_t>(std::lower_bound(docs.begin(), docs.end(), d) - docs.begin());
  }
  void sort_docs() {
    std::sort(docs.begin(), docs.end());
    docs.erase(std::unique(docs.begin(), docs.end()), docs.end());
  }

  void read_squad(const nlohmann::json& j) {
    using J = nlohmann::json;
    const auto& data = field(j, "data", &J::is_array, "a list of articles", "top level");
    for (size_t a = 0; a < data.size(); ++a)
      for (const auto& p : field(data[a], "paragraphs", &J::is_array, "a list", fmt::format("data[{}]", a)))
        docs.push_back(field(p, "context", &J::is_string, "a string", fmt::format("data[{}].paragraphs", a)));
    sort_docs();
    for (size_t a = 0; a < data.size(); ++a) {
      std::vector<size_t> article;
      for (const auto& p : data[a]["paragraphs"]) article.push_back(index_of(p["context"]));
      for (size_t pi = 0; pi < data[a]["paragraphs"].size(); ++pi) {
        const auto& p = data[a]["paragraphs"][pi];
        const std::string where = fmt::format("data[{}].paragraphs[{}]", a, pi);
        const size_t gold = index_of(p["context"]);
        for (const auto& q : field(p, "qas", &J::is_array, "a list of questions", where)) {
          if (field(q, "is_impossible", &J::is_boolean, "true or false (SQuAD 2.0)", where + ".qas").get<bool>())
            continue;
          Question x;
          x.query = field(q, "question", &J::is_string, "a string", where + ".qas");
          for (const auto& ans : field(q, "answers", &J::is_array, "a list", where + ".qas"))
            x.outputs.push_back(field(ans, "text", &J::is_string, "a string", where + ".qas.answers"));
          x.gold = {gold};
          for (size_t d : article)
            if (d != gold) x.more.push_back(d);
          questions.push_back(std::move(x));
        }
      }
    }
  }

  // A document is "title\nsentence sentence..." (the sentences joined as they are).
  std::string hotpot_doc(const nlohmann::json& entry, const std::string& where) const {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() || !entry[1].is_array())
      fail("{}: {}: each context entry must be [title, [sentences]]", path_, where);
    std::string d = entry[0].get<std::string>() + "\n";
    for (const auto& s : entry[1]) {
      if (!s.is_string()) fail("{}: {}: sentences must be strings", path_, where);
      d += s.get<std::string>();
    }
    return d;
  }

  void read_hotpotqa(const nlohmann::json& j) {
    using J = nlohmann::json;
    if (!j.is_array()) fail("{}: expected a list of questions (HotpotQA's dev file)", path_);
    for (size_t i = 0; i < j.size(); ++i)
      for (const auto& c : field(j[i], "context", &J::is_array, "a list", fmt::format("[{}]", i)))
        docs.push_back(hotpot_doc(c, fmt::format("[{}].context", i)));
    sort_docs();
    for (size_t i = 0; i < j.size(); ++i) {
      const std::string where = fmt::format("[{}]", i);
      Question x;
      x.query = field(j[i], "question", &J::is_string, "a string", where);
      x.outputs = {field(j[i], "answer", &J::is_string, "a string", where).get<std::string>()};
      for (const auto& c : j[i]["context"]) x.gold.push_back(index_of(hotpot_doc(c, where)));
      questions.push_back(std::move(x));
    }
  }

  std::string path_;
};

class RulerQa final : public RulerTask {
 public:
  RulerQa(const TaskContext& ctx, const Params& p) : RulerTask(ctx, p, 32), squad_(name_ == "qa_1") {
    part_ = true;
    std::string path = p.get("qa_file");
    if (path.empty()) path = fmt::format("{}/ruler/{}", ctx.data_dir, squad_ ? "squad.json" : "hotpotqa.json");
    if (!std::ifstream(path))
      fail("ruler {}: {} not found. RULER's {} is {} ({}); put it there or pass qa_file=<path>", name_, path, name_,
           squad_ ? "SQuAD 2.0" : "HotpotQA",
           squad_ ? "the dev set, dev-v2.0.json"
                  : "the dev set, distractor setting, "
                    "hotpot_dev_distractor_v1.json");
    data_ = std::make_unique<Dataset>(path, squad_);
    if (n_samples_ > data_->questions.size())
      fail("ruler {}: {} samples asked, {} has {} questions", name_, n_samples_, path, data_->questions.size());
    for (auto& f : fit({length_, gen_, kIncrement, kIncrement}, n_samples_,
                       [this](int docs, size_t sample) { return build(sample, docs); }))
      add(std::move(f.built), {{"documents", f.units}, {"source", path}});
  }

 private:
  Built build(size_t index, int num_docs) {
    const Question& q = data_->questions[index];
    const size_t n = static_cast<size_t>(num_docs), total = data_->docs.size();
    Built b;
    std::vector<size_t> chosen;
    if (n < total) {
      if (n < q.gold.size()) {  // random.sample raises for a negative count
        b.ok = false;
        return b;
      }
      chosen = q.gold;
      if (n - q.gold.size() > q.more.size()) {
        chosen.insert(chosen.end(), q.more.begin(), q.more.end());
        const std::set<size_t> taken(chosen.begin(), chosen.end());
        std::vector<size_t> other;
        for (size_t i = 0; i < total; ++i)
          if (!taken.count(i)) other.push_back(i);
        for (size_t k : rng_.sample(other.size(), n - chosen.size())) chosen.push_back(other[k]);
      } else {
        for (size_t k : rng_.sample(q.more.size(), n - q.gold.size())) chosen.push_back(q.more[k]);
      }
    } else {
      for (size_t i = 0; i < n; ++i) chosen.push_back(i % total);  // the whole set, repeated
    }
    PyRandom(seed_).shuffle(chosen);
    std::string context;
    for (size_t i = 0; i < chosen.size(); ++i)
      context += fmt::format("{}Document {}:\n{}", i ? "\n\n" : "", i + 1, data_->docs[chosen[i]]);
    b.input = fill_template(kTemplate, {{"context", context}, {"query", q.query}});
    b.answers = q.outputs;
    b.tokens = count(b.input);
    return b;
  }

  bool squad_;
  std::unique_ptr<Dataset> data_;
};

}  // namespace

std::unique_ptr<Task> make_ruler_qa(const TaskContext& ctx, const Params& p) {
  return std::make_unique<RulerQa>(ctx, p);
}

}  // namespace kvb
