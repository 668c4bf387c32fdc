// The perplexity task: windows of the text, its file layouts and errors, and on the default model the
// windows' mean NLLs against transformers' (tasks/perplexity/reference.py), the compressed-prefix
// protocol, and the report's perplexity tables.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/report/report.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

std::unique_ptr<Task> ppl_task(const std::string& file, std::map<std::string, std::string> options = {}) {
  static const auto tok = load_tokenizer_file(fixture("tokenizer/synthetic/qwen2.json"));
  options["file"] = file;
  TaskContext ctx;
  ctx.tokenizer = tok.get();
  ctx.options = options;
  ctx.data_dir = default_data_dir();
  return TaskRegistry::get().create("perplexity", ctx);
}

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto p = (dir / name).string();
  std::ofstream(p) << text;
  return p;
}

// The reference script's text: the first three essays joined by blank lines, cut to 20,000 characters.
std::string reference_text(const std::string& data) {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(data + "/PaulGrahamEssays"))
    if (e.path().extension() == ".txt") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  std::string text;
  for (size_t i = 0; i < 3 && i < files.size(); ++i) {
    std::ifstream in(files[i]);
    text += (i ? "\n\n" : "") + std::string(std::istreambuf_iterator<char>(in), {});
  }
  // Python's [:20000] counts code points.
  size_t cut = 0;
  for (int n = 0; cut < text.size() && n < 20000; ++n) next_cp(text, cut);
  return text.substr(0, cut);
}

}  // namespace

TEST_CASE("perplexity task: consecutive windows of seq_len tokens, from a text or a JSONL file",
          "[tasks][perplexity]") {
  const TempDir dir("ppl_task");
  std::string text;
  for (int i = 0; i < 200; ++i) text += "word" + std::to_string(i % 17) + " and more. ";
  const auto t = ppl_task(write(dir, "a.txt", text), {{"seq_len", "64"}, {"bos", "none"}});
  static const auto tok = load_tokenizer_file(fixture("tokenizer/synthetic/qwen2.json"));
  const auto ids = tok->encode(text);
  REQUIRE(t->size() == ids.size() / 64);
  for (size_t w = 0; w < t->size(); ++w) {
    const Sample s = t->sample(w);
    REQUIRE(s.scored_text);
    CHECK(s.scored_text->ids ==
          std::vector<int32_t>(ids.begin() + std::ptrdiff_t(w * 64), ids.begin() + std::ptrdiff_t((w + 1) * 64)));
    CHECK(s.scored_text->compress_at == 0);
    CHECK(s.meta["window"] == w);
  }
  CHECK(ppl_task((dir / "a.txt").string(), {{"seq_len", "64"}, {"windows", "2"}})->size() == 2);
  CHECK(ppl_task((dir / "a.txt").string(), {{"seq_len", "64"}, {"compress_at", "16"}})
            ->sample(0)
            .scored_text->compress_at == 16);
  // JSONL rows joined by blank lines, as GPTQ joins WikiText-2's.
  const auto j = ppl_task(
      write(dir, "b.jsonl", "{\"text\": \"" + text.substr(0, 900) + "\"}\n{\"text\": \"" + text.substr(900) + "\"}\n"),
      {{"seq_len", "64"}, {"bos", "none"}});
  const auto joined = tok->encode(text.substr(0, 900) + "\n\n" + text.substr(900));
  CHECK(j->sample(1).scored_text->ids == std::vector<int32_t>(joined.begin() + 64, joined.begin() + 128));
  // Errors name the file, the line or the option.
  require_error([&] { ppl_task(write(dir, "bad.jsonl", "{\"text\": 5}\n")); }, {"bad.jsonl:1", "'text'"});
  require_error([&] { ppl_task((dir / "none.txt").string()); }, {"none.txt", "cannot read"});
  require_error([&] { ppl_task(write(dir, "short.txt", "a few words")); }, {"short.txt", "fewer than one window"});
  require_error(
      [&] {
        ppl_task((dir / "a.txt").string(), {{"seq_len", "64"}, {"compress_at", "64"}});
      },
      {"compress_at 64", "below seq_len 64"});
  require_error([&] { t->score(Sample{}, ""); }, {"perplexity"});
  // A text of the user's own: its column says "Text"; without a file it is an error.
  CHECK(ppl_task((dir / "a.txt").string(), {{"seq_len", "64"}, {"dataset", "text"}})->sample(0).meta["dataset"] ==
        "text");
  require_error(
      [&] {
        TaskContext ctx;
        ctx.tokenizer = tok.get();
        ctx.options = {{"dataset", "text"}};
        TaskRegistry::get().create("perplexity", ctx);
      },
      {"dataset text", "file=PATH"});
}

TEST_CASE("perplexity on the default model: transformers' window NLLs, the compressed prefix, the report",
          "[tasks][perplexity][model]") {
  const auto model = model_file(kDefaultModel);
  if (!model || !setup_data("PaulGrahamEssays")) return;
  const nlohmann::json ref =
      nlohmann::json::parse(std::ifstream(source_path("tasks/perplexity/fixtures/transformers_nll.json")));
  const TempDir dir("ppl_sweep");
  const std::string text = write(dir, "essays.txt", reference_text(default_data_dir()));
  const std::string out = (dir / "r.jsonl").string();
  // Three windows of 256 tokens, whole (compress_at 0) and over a compressed prefix of 128 tokens.
  const std::string spec = write(dir, "s.yaml",
                                 "model: " + *model + "\ntask: perplexity\ntask_options:\n  file: " + text +
                                     "\n  seq_len: 256\n  windows: 3\n  compress_at: [0, 128]\nmethods: [fullkv, "
                                     "streamingllm]\nbudgets: [32]\nthreads: 2\nout: " +
                                     out + "\n");
  const SweepOutcome o = Sweep(load_experiment(spec)).run(false);
  CHECK(o.run == 12);
  CHECK(o.failed == 0);
  std::map<std::tuple<std::string, std::string, int>, double> nll;  // (method, compress_at, window)
  for_each_record(out, [&](const nlohmann::json& r, int) {
    CHECK(r["scored_tokens"] == 255);
    CHECK(r["perplexity"].get<double>() == Approx(std::exp(r["nll"].get<double>())));
    nll[{r["config"]["method"], r["config"]["options"].value("compress_at", "0"), r["meta"]["window"]}] = r["nll"];
  });
  double full_prefix = 0, evicted_prefix = 0;
  for (int w = 0; w < 3; ++w) {
    INFO("window " << w);
    const double want = ref["windows"][w]["nll"];
    CHECK(nll[{"fullkv", "0", w}] == Approx(want).margin(2e-4));
    // Decoding over the full cache is the same model as the prefill.
    CHECK(nll[{"fullkv", "128", w}] == Approx(want).margin(2e-4));
    // An eviction after the prefill leaves a whole-window prefill's numbers alone.
    CHECK(nll[{"streamingllm", "0", w}] == nll[{"fullkv", "0", w}]);
    full_prefix += nll[{"fullkv", "128", w}];
    evicted_prefix += nll[{"streamingllm", "128", w}];
  }
  CHECK(evicted_prefix > full_prefix);  // 32 of 128 prefix tokens kept: a worse prediction of the rest

  const std::string rep = (dir / "report").string();
  write_report({out}, rep, {"md"});
  std::ifstream in(rep + "/perplexity.md");
  const std::string table(std::istreambuf_iterator<char>(in), {});
  double mean = 0;
  for (int w = 0; w < 3; ++w) mean += nll[{"fullkv", "0", w}] / 3;
  INFO(table);
  CHECK(table.find(fmt::format("| {:.2f} |", std::exp(mean))) != std::string::npos);  // exp of the mean NLL
  CHECK(table.find("lower is better") != std::string::npos);
}
