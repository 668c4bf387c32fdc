// The mc task: the five benchmarks' layouts read into lm-eval's requests, their errors by file, line
// and field, and a sweep on the default model scored as lm-evaluation-harness 0.4.13 scored the same
// files (tasks/mc/reference.py: log-likelihoods, greedy flags, acc and acc_norm).
#include <filesystem>
#include <fstream>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

const std::vector<std::string> kBenchmarks = {"arc_challenge", "arc_easy", "piqa", "winogrande", "hellaswag"};

std::string fixtures(const std::string& name = "") { return source_path("tasks/mc/fixtures/" + name); }

std::unique_ptr<Task> mc_task(const std::string& dataset, const std::string& file,
                              std::map<std::string, std::string> options = {}) {
  static const auto tok = load_tokenizer_file(fixture("tokenizer/synthetic/qwen2.json"));
  options["dataset"] = dataset;
  options["file"] = file;
  TaskContext ctx;
  ctx.tokenizer = tok.get();
  ctx.options = options;
  ctx.data_dir = default_data_dir();
  return TaskRegistry::get().create("mc", ctx);
}

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto p = (dir / name).string();
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("mc task: lm-eval's prompts, choices and gold index per benchmark", "[tasks][mc]") {
  const TempDir dir("mc_layouts");
  SECTION("ARC: Question/Answer prompt, ' ' + choice, answerKey by label; both layouts alike") {
    const auto flat = mc_task("arc_easy", write(dir, "flat.jsonl",
                                                R"({"id": "q1", "question": "Which is a gas?", "choices": )"
                                                R"({"text": ["ice", "steam", "rock"], "label": ["1", "2", "3"]}, )"
                                                R"("answerKey": "2"})"
                                                "\n"));
    const auto released =
        mc_task("arc_easy", write(dir, "released.jsonl",
                                  R"({"id": "q1", "question": {"stem": "Which is a gas?", "choices": )"
                                  R"([{"text": "ice", "label": "1"}, {"text": "steam", "label": "2"}, )"
                                  R"({"text": "rock", "label": "3"}]}, "answerKey": "2"})"
                                  "\n"));
    for (const auto* t : {flat.get(), released.get()}) {
      const Sample s = t->sample(0);
      REQUIRE(s.choices);
      REQUIRE(s.choices->options.size() == 3);
      CHECK(s.choices->gold == 1);
      CHECK(s.choices->options[1].context == "Question: Which is a gas?\nAnswer:");
      CHECK(s.choices->options[1].continuation == " steam");
      CHECK(s.choices->options[1].text == "steam");
      CHECK(s.answers == std::vector<std::string>{"steam"});
      CHECK(s.choices->metric == "acc");
    }
    CHECK(flat->sample(0).id == released->sample(0).id);  // the same sample, whichever layout
  }
  SECTION("PIQA: the goal as the question, labels in the line or in the released labels file") {
    const std::string line = R"({"goal": "Open a jar", "sol1": "twist the lid", "sol2": "shake it"})";
    const auto t = mc_task("piqa", write(dir, "p.jsonl", line + "\n" + line + "\n"),
                           {{"labels", write(dir, "p-labels.lst", "1\n0\n")}});
    CHECK(t->sample(0).choices->gold == 1);
    CHECK(t->sample(1).choices->gold == 0);
    CHECK(t->sample(0).choices->options[0].context == "Question: Open a jar\nAnswer:");
    // Labels go by sample, not by line: a blank line between samples shifts nothing.
    const auto gap = mc_task("piqa", write(dir, "gap.jsonl", line + "\n\n" + line + "\n" + line + "\n"),
                             {{"labels", write(dir, "gap-labels.lst", "0\n1\n1\n")}});
    CHECK(gap->sample(1).choices->gold == 1);
    CHECK(gap->sample(2).choices->gold == 1);
    // A labels file of another length is someone else's: an error, not a silent shift.
    require_error(
        [&] {
          mc_task("piqa", write(dir, "short.jsonl", line + "\n"), {{"labels", write(dir, "long.lst", "1\n0\n1\n")}});
        },
        {"long.lst", "3 lines for the 1 samples", "one line per sample"});
    const auto labelled = mc_task("piqa", write(dir, "q.jsonl",
                                                R"({"goal": "g", "sol1": "a", "sol2": "b", "label": "1"})"
                                                "\n"));
    CHECK(labelled->sample(0).choices->gold == 1);
  }
  SECTION("Winogrande: one context per option, the rest of the sentence scored, by acc") {
    const auto t =
        mc_task("winogrande", write(dir, "w.jsonl",
                                    R"({"qID": "a", "sentence": "Sarah gave Maria a gift because _ was kind. ", )"
                                    R"("option1": "Sarah", "option2": "Maria", "answer": "2"})"
                                    "\n"));
    const Sample s = t->sample(0);
    CHECK(s.choices->gold == 1);
    CHECK(s.choices->options[0].context == "Sarah gave Maria a gift because Sarah");
    CHECK(s.choices->options[1].context == "Sarah gave Maria a gift because Maria");
    CHECK(s.choices->options[1].continuation == " was kind.");
    CHECK_FALSE(s.choices->acc_norm);
    // No acc_norm in lm-eval's winogrande: acc stands in.
    CHECK(mc_task("winogrande", (dir / "w.jsonl").string(), {{"metric", "acc_norm"}})->sample(0).choices->metric ==
          "acc");
  }
  SECTION("HellaSwag: activity label, ctx_a and ctx_b capitalized, WikiHow markers out") {
    const auto t =
        mc_task("hellaswag",
                write(dir, "h.jsonl",
                      R"({"ind": 7, "activity_label": "Roof shingle removal", "ctx_a": "A man is on a roof.", )"
                      R"("ctx_b": "HE starts", "endings": ["[header] pulling up nails [title] Go.", )"
                      R"(" ripping  [step] shingles", "[hea\rder] a", "b"], "label": "1"})"
                      "\n"),
                {{"metric", "acc_norm"}});
    const Sample s = t->sample(0);
    CHECK(s.choices->gold == 1);
    CHECK(s.choices->metric == "acc_norm");
    CHECK(s.choices->options[0].context == "Roof shingle removal: A man is on a roof. He starts");
    CHECK(s.choices->options[0].text == " pulling up nails. Go.");
    // Python's replace("  ", " ") halves a run of three spaces once: two remain, as lm-eval has them.
    CHECK(s.choices->options[1].text == "ripping  shingles");
    CHECK(s.choices->options[2].text == " a");  // a carriage return inside a marker: still a marker
    CHECK(s.id.rfind("7-", 0) == 0);
  }
  CHECK(python_capitalize("hELLO wORLD") == "Hello world");
  CHECK(python_capitalize("\xc3\xa9t\xc3\x89") == "\xc3\x89t\xc3\xa9");  // étÉ -> Été
  // Python's full title case (found by an independent check against lm-eval): ßtraße -> Sstraße, ﬁne -> Fine,
  // ǆ -> ǅ (one character), and the final sigma of the lowered rest.
  CHECK(python_capitalize("\u00dftra\u00dfe") == "Sstra\u00dfe");
  CHECK(python_capitalize("\ufb01NE") == "Fine");
  CHECK(python_capitalize("\u01c6x") == "\u01c5x");
  CHECK(python_capitalize("\u1f50X") == "\u03a5\u0313x");
  CHECK(python_capitalize("\u039f\u0394\u039f\u03a3") == "\u039f\u03b4\u03bf\u03c2");
  CHECK(python_capitalize("\u039f\u03a3") == "\u039f\u03c2");  // the title-cased first letter precedes the sigma
  CHECK(python_len("\xc3\xa9t\xc3\xa9") == 3);
}

TEST_CASE("mc task: bad files and options name the file, the line and the field", "[tasks][mc]") {
  const TempDir dir("mc_errors");
  const auto bad = [&](const std::string& dataset, const std::string& line, std::initializer_list<std::string> want) {
    require_error([&] { mc_task(dataset, write(dir, "bad.jsonl", line + "\n")); }, want);
  };
  bad("arc_easy", R"({"question": "q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "B"})",
      {"bad.jsonl:1", "'answerKey'", "'B'"});
  bad("arc_easy", R"({"question": "q", "answerKey": "A"})", {"bad.jsonl:1", "field 'choices' is missing"});
  bad("arc_easy", R"({"question": "q", "choices": {"text": ["a", "b"], "label": ["A"]}, "answerKey": "A"})",
      {"bad.jsonl:1", "2 choice texts but 1 labels"});
  bad("piqa", R"({"goal": "g", "sol1": "a", "sol2": "b"})", {"bad.jsonl:1", "'label' is missing", "labels"});
  bad("piqa", R"({"goal": "g", "sol1": "a", "sol2": "b", "label": 2})", {"bad.jsonl:1", "'label'", "0 to 1"});
  bad("winogrande", R"({"sentence": "no blank", "option1": "a", "option2": "b", "answer": "1"})",
      {"bad.jsonl:1", "no blank"});
  bad("winogrande", R"({"sentence": "a _ b", "option1": "a", "option2": "b", "answer": ""})",
      {"bad.jsonl:1", "'answer'", "unlabelled"});
  bad("hellaswag", R"({"activity_label": "x", "ctx_a": "a", "ctx_b": "b", "endings": "e", "label": 0})",
      {"bad.jsonl:1", "'endings'", "list of strings"});
  bad("hellaswag", R"({"ctx_a": "a", "ctx_b": "b", "endings": ["e"], "label": 0})",
      {"bad.jsonl:1", "'activity_label' is missing", "HellaSwag"});
  // A file of one benchmark read as another: its fields are not there.
  require_error([&] { mc_task("hellaswag", fixtures("piqa.jsonl")); }, {"piqa.jsonl:1", "'activity_label' is missing"});
  require_error([&] { mc_task("piqa", (dir / "none.jsonl").string()); }, {"none.jsonl", "cannot read", "mc"});
  require_error([&] { mc_task("arc_easy", fixtures("arc_easy.jsonl"), {{"labels", "x"}}); }, {"'labels'", "PIQA"});
  require_error([&] { mc_task("gsm8k", fixtures("arc_easy.jsonl")); }, {"dataset", "gsm8k"});
  require_error([&] { mc_task("piqa", fixtures("piqa.jsonl"))->score(Sample{}, "x"); }, {"log-likelihood"});
}

TEST_CASE("mc task on the default model: lm-evaluation-harness's log-likelihoods, acc and acc_norm",
          "[tasks][mc][model]") {
  const auto model = model_file(kDefaultModel);
  if (!model) return;
  const nlohmann::json golden = nlohmann::json::parse(std::ifstream(fixtures("lm_eval.json")))["benchmarks"];
  const TempDir dir("mc_sweep");
  std::filesystem::create_directories(dir / "mc");
  for (const auto& b : kBenchmarks) std::filesystem::copy_file(fixtures(b + ".jsonl"), dir / "mc" / (b + ".jsonl"));
  const std::string out = (dir / "r.jsonl").string();
  // Eight samples of each benchmark (40 samples, 128 choices); the reference script checks all 180.
  const std::string spec =
      write(dir, "s.yaml",
            "model: " + *model + "\ntask: mc\ntask_options:\n  dataset: [" +
                "arc_challenge, arc_easy, piqa, winogrande, hellaswag]\ndata: " + dir.path().string() +
                "\nlimit: 8\nmethods: [fullkv, streamingllm]\nbudgets: [8]\nthreads: 2\nout: " + out + "\n");
  const SweepOutcome o = Sweep(load_experiment(spec)).run(false);
  CHECK(o.run == 80);
  CHECK(o.failed == 0);
  int checked = 0, compressed = 0;
  for_each_record(out, [&](const nlohmann::json& r, int) {
    const std::string b = r["meta"]["dataset"];
    const nlohmann::json& want = golden[b][r["meta"]["line"].get<int>() - 1];
    const auto& choices = r["choices"];
    REQUIRE(choices.size() == want["loglikelihood"].size());
    if (r["config"]["method"] == "streamingllm") {
      // Compressed to 8 tokens: a different number, still a log-probability.
      for (const auto& c : choices) CHECK(c["loglikelihood"].get<double>() < 0);
      CHECK(r["kv_bytes"].get<size_t>() <= r["full_kv_bytes"].get<size_t>());
      compressed += r["kv_bytes"].get<size_t>() < r["full_kv_bytes"].get<size_t>();
      return;
    }
    for (size_t k = 0; k < choices.size(); ++k) {
      INFO(b << " line " << r["meta"]["line"] << " choice " << k);
      const double ours = choices[k]["loglikelihood"], ref = want["loglikelihood"][k];
      CHECK(std::abs(ours - ref) <= 1e-3 + 1e-5 * std::abs(ref));
      CHECK(choices[k]["greedy"] == want["greedy"][k]);
    }
    CHECK(r["acc"] == want["acc"]);
    CHECK(r["score"] == want["acc"]);
    CHECK(r.contains("acc_norm") == want.contains("acc_norm"));
    if (want.contains("acc_norm")) CHECK(r["acc_norm"] == want["acc_norm"]);
    ++checked;
  });
  CHECK(checked == 40);
  CHECK(compressed >= 30);  // contexts of 8 tokens or fewer keep everything
  // Resumed: every cell is recorded, none runs again.
  CHECK(Sweep(load_experiment(spec)).run(false).run == 0);
}
