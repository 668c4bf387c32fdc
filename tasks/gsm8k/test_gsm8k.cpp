// The gsm8k task against lm-evaluation-harness 0.4.13's gsm8k on the same files (tasks/gsm8k/reference.py):
// its 5-shot prompts, its strict-match and flexible-extract scores of its generations and of made-up
// responses, a sweep's generations on the default model, and bad files named by file, line and field.
#include <filesystem>
#include <fstream>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

std::string fixtures(const std::string& name = "") { return source_path("tasks/gsm8k/fixtures/" + name); }

const nlohmann::json& golden() {
  static const nlohmann::json g = nlohmann::json::parse(std::ifstream(fixtures("lm_eval.json")));
  return g;
}

std::unique_ptr<Task> gsm8k_task(std::map<std::string, std::string> options) {
  static const auto tok = load_tokenizer_file(fixture("tokenizer/synthetic/qwen2.json"));
  options.try_emplace("file", fixtures("test.jsonl"));
  options.try_emplace("fewshot_file", fixtures("train.jsonl"));
  TaskContext ctx;
  ctx.tokenizer = tok.get();
  ctx.options = options;
  ctx.data_dir = default_data_dir();
  return TaskRegistry::get().create("gsm8k", ctx);
}

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto p = (dir / name).string();
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("gsm8k task: lm-eval's 5-shot prompts and its two filters' scores", "[tasks][gsm8k]") {
  const auto& samples = golden()["samples"];
  REQUIRE(samples.size() == 40);
  const auto strict = gsm8k_task({{"metric", "strict"}}), flexible = gsm8k_task({{"metric", "flexible"}});
  REQUIRE(strict->size() == 40);
  int right[2] = {0, 0};
  for (size_t i = 0; i < samples.size(); ++i) {
    INFO("sample " << i);
    const Sample s = strict->sample(i);
    CHECK(s.prompt == samples[i]["prompt"].get<std::string>());
    CHECK(s.max_new_tokens == 256);
    CHECK(s.stop == std::vector<std::string>{"Question:", "</s>", "<|im_end|>"});
    CHECK(s.id == flexible->sample(i).id);  // the filter scores a generation; the sample is the same
    const std::string generation = samples[i]["generation"];
    CHECK(strict->score(s, generation) == samples[i]["strict"].get<double>());
    CHECK(flexible->score(s, generation) == samples[i]["flexible"].get<double>());
    right[0] += strict->score(s, generation) > 0;
    right[1] += flexible->score(s, generation) > 0;
  }
  // Made-up responses: numbers with commas, dollars, signs, decimals and periods, after "#### " or not.
  int checked = 0, told_apart = 0;
  for (const auto& r : golden()["responses"]) {
    INFO("response " << r["response"].dump() << " against " << r["answer"].dump());
    const PredictionToScore p{.prediction = r["response"], .answers = {r["answer"]}};
    CHECK(score_prediction("gsm8k/strict", p) == r["strict"].get<double>());
    CHECK(score_prediction("gsm8k/flexible", p) == r["flexible"].get<double>());
    told_apart += r["strict"] != r["flexible"];
    ++checked;
  }
  CHECK(checked >= 30);
  CHECK(told_apart >= 8);  // the fixtures exercise where the filters disagree
  // Zero shots: the problem alone.
  const Sample zero = gsm8k_task({{"num_fewshot", "0"}})->sample(0);
  CHECK(zero.prompt.rfind("Question: ", 0) == 0);
  CHECK(zero.prompt.find("####") == std::string::npos);
  CHECK(zero.id != strict->sample(0).id);
  require_error([] { score_prediction("gsm8k", {.prediction = "1", .answers = {"#### 1"}}); }, {"gsm8k/strict"});
}

TEST_CASE("gsm8k task: bad files name the file, the line and the field", "[tasks][gsm8k]") {
  const TempDir dir("gsm8k_errors");
  const auto bad = [&](const std::string& line, std::initializer_list<std::string> want) {
    require_error([&] { gsm8k_task({{"file", write(dir, "bad.jsonl", line + "\n")}}); }, want);
  };
  bad(R"({"question": "q"})", {"bad.jsonl:1", "field 'answer' is missing", "question and answer"});
  bad(R"({"question": 3, "answer": "#### 3"})", {"bad.jsonl:1", "field 'question' must be a string"});
  bad(R"({"question": "q", "answer": "3"})", {"bad.jsonl:1", "'answer'", "#### "});
  bad(R"(["q", "#### 3"])", {"bad.jsonl:1", "JSON object"});
  // A multiple-choice file given as GSM8K: its fields are not there.
  require_error(
      [] {
        gsm8k_task({{"file", source_path("tasks/mc/fixtures/piqa.jsonl")}});
      },
      {"piqa.jsonl:1", "field 'question' is missing"});
  require_error(
      [&] {
        gsm8k_task({{"fewshot_file", write(dir, "two.jsonl",
                                           R"({"question": "q", "answer": "#### 1"})"
                                           "\n")}});
      },
      {"two.jsonl", "1 problems", "num_fewshot=5"});
  require_error(
      [&] {
        gsm8k_task({{"file", (dir / "none.jsonl").string()}});
      },
      {"none.jsonl", "cannot read", "'file'"});
  require_error([] { gsm8k_task({{"metric", "acc"}}); }, {"metric", "strict"});
}

TEST_CASE("gsm8k task on the default model: lm-eval's generations, both filters from one generation",
          "[tasks][gsm8k][model]") {
  const auto model = model_file(kDefaultModel);
  if (!model) return;
  const TempDir dir("gsm8k_sweep");
  std::filesystem::create_directories(dir / "gsm8k");
  for (const char* f : {"test.jsonl", "train.jsonl"}) std::filesystem::copy_file(fixtures(f), dir / "gsm8k" / f);
  const std::string out = (dir / "r.jsonl").string();
  const std::string spec =
      write(dir, "s.yaml",
            "model: " + *model + "\ntask: gsm8k\ntask_options:\n  metric: [strict, flexible]\n" +
                "data: " + dir.path().string() +
                "\nlimit: 3\nmethods: [fullkv, streamingllm]\nbudgets: [128]\nthreads: 2\nout: " + out + "\n");
  const SweepOutcome o = Sweep(load_experiment(spec)).run(false);
  CHECK(o.run == 12);
  CHECK(o.failed == 0);
  std::map<std::string, std::string> generation;  // by method and sample: the two filters read one
  int rescored = 0, same = 0;
  for_each_record(out, [&](const nlohmann::json& r, int) {
    const auto& want = golden()["samples"][r["meta"]["line"].get<size_t>() - 1];
    const std::string metric = r["config"]["options"]["metric"];
    const std::string key = r["config"]["method"].get<std::string>() + r["id"].get<std::string>();
    if (const auto [it, fresh] = generation.emplace(key, r["prediction"]); !fresh) {
      CHECK(it->second == r["prediction"].get<std::string>());
      CHECK(r.contains("scored_from"));
      ++rescored;
    }
    if (r["config"]["method"] != "fullkv") return;
    // Greedy decoding over the same float32 model: the same text as transformers' generate.
    same += r["prediction"] == want["generation"];
    CHECK(r["score"] == want[metric]);
  });
  CHECK(rescored == 6);
  CHECK(same == 6);
  CHECK(Sweep(load_experiment(spec)).run(false).run == 0);

  // Found by a review: a generation recorded from another prompt (another data directory) was scored
  // again for this one. Here the strict records, as another prompt's, under a flexible-only spec.
  const std::string other = (dir / "other.jsonl").string();
  {
    ResultsFile f(other);
    for_each_record(out, [&](const nlohmann::json& r, int) {
      if (r["config"]["options"]["metric"] != "strict") return;
      nlohmann::json moved = r;
      moved["prompt_digest"] = "0123456789abcdef";
      f.append(moved);
    });
  }
  require_error(
      [&] {
        Sweep(load_experiment(spec, {"task_options.metric=flexible", "out=" + other})).run(false);
      },
      {"other.jsonl:1", "generated from another prompt", "cannot be scored again"});
}
