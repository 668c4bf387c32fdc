// The second default model, Qwen2.5-Coder-0.5B-Instruct (the GGUF of its AWQ release: F32, Q4_K, Q5_0,
// Q6_K and Q8_0 tensors), against Hugging Face transformers running the same file
// (tools/reference/qwen_parity.py, tests/fixtures/engine/qwen_parity.json): tokenizer ids, chat
// prompts, logits at a few positions, top-1 and greedy continuations. scripts/setup.sh fetches this
// model only when asked (--model qwen2.5-coder-0.5b), so these tests skip with a warning when it is
// absent, also under KVBENCH_REQUIRE_MODELS=1; KVBENCH_REQUIRE_QWEN=1 makes its absence a failure.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/chat_template.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

const char* kQwenModel = "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf";

// Logits may differ from transformers' by this fraction of the position's largest |logit|. Both sides
// compute in fp32 on the same dequantized weights (Q5_0, Q4_K, ... to fp32 is exact), so only the order
// of the sums differs: observed 2.2e-6 at most over the 13 positions compared here (SmolLM2's parity
// test allows 1e-3 and observes 2.6e-6). The greedy continuations' smallest margin, 0.018, is ten
// times the logit error allowed at their positions (1e-4 x max |logit| < 0.002).
constexpr float kRelTol = 1e-4f;

// An optional model: absent, it skips even under KVBENCH_REQUIRE_MODELS; KVBENCH_REQUIRE_QWEN=1 fails.
std::optional<std::string> qwen_model_file() {
  return test::model_file(kQwenModel, "KVBENCH_REQUIRE_QWEN", "scripts/setup.sh --model qwen2.5-coder-0.5b");
}

nlohmann::json qwen_fixture() {
  std::ifstream jf(test::fixture("engine/qwen_parity.json"));
  REQUIRE(jf.good());
  return nlohmann::json::parse(jf);
}

// Compares the logits of one position with the fixture's record of it: the probe ids' logits, the
// largest |logit| and the top-1 (and, when given, the top-20 logits). Returns the largest difference
// relative to the position's max |logit|.
float compare_position(const std::vector<float>& got, const nlohmann::json& want, const std::vector<int32_t>& probe_ids,
                       const nlohmann::json* top20) {
  REQUIRE(got.size() == 151936);
  const float scale = want["max_abs_logit"].get<float>();
  REQUIRE(scale > 0);
  float diff = 0;
  // std::max would pass over a NaN; a NaN logit must fail.
  auto note = [&diff](float d) {
    if (!(d <= diff)) diff = std::isnan(d) ? INFINITY : d;
  };
  float got_scale = 0;
  for (float x : got) got_scale = std::isnan(x) ? INFINITY : std::max(got_scale, std::abs(x));
  note(std::abs(got_scale - scale));
  const auto probe_logits = want["logits"].get<std::vector<float>>();
  REQUIRE(probe_logits.size() == probe_ids.size());
  for (size_t i = 0; i < probe_ids.size(); ++i)
    note(std::abs(got[static_cast<size_t>(probe_ids[i])] - probe_logits[i]));
  if (top20)
    for (const auto& e : *top20) note(std::abs(got[e[0].get<size_t>()] - e[1].get<float>()));
  const int32_t top1 = argmax(got);
  INFO("max |diff| " << diff << ", max |logit| " << scale << "; argmax " << top1 << " (logit "
                     << got[static_cast<size_t>(top1)] << "), transformers' " << want["argmax"].get<int32_t>()
                     << " (margin " << want["margin"].get<float>() << ")");
  CHECK(diff <= kRelTol * scale);
  CHECK(top1 == want["argmax"].get<int32_t>());
  return diff / scale;
}

}  // namespace

TEST_CASE("Qwen2.5-Coder tokenizer and chat prompts match transformers", "[tokenizer][model][qwen]") {
  auto path = qwen_model_file();
  if (!path) return;
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  const auto ref = qwen_fixture();
  CHECK(tok->kind() == "bpe (qwen2)");
  CHECK(tok->vocab_size() == 151936);
  CHECK(tok->special().bos == 151643);  // <|endoftext|>
  CHECK(tok->special().eos == 151645);  // <|im_end|>
  CHECK_FALSE(tok->special().add_bos);
  CHECK(tok->is_end_of_generation(151645));

  // Ids of Qwen2.5's tokenizer.json layout (NFC, the Qwen2 split regex, byte-level BPE). transformers'
  // GGUF tokenizer gives the same except on the NFD line, which it does not normalize (hf_gguf_ids).
  const auto& rows = ref["tokenizer"];
  REQUIRE(rows.size() >= 10);
  size_t same = 0;
  for (const auto& row : rows) {
    const std::string text = row["text"].get<std::string>();
    const auto want = row["ids"].get<std::vector<int32_t>>();
    const auto got = tok->encode(text);
    INFO(row["name"].get<std::string>() << ": " << nlohmann::json(text).dump() << "\nwant "
                                        << nlohmann::json(want).dump() << "\ngot  " << nlohmann::json(got).dump());
    CHECK(got == want);
    same += got == want;
    // Where decoding does not give the text back (NFD text comes back composed), the reference's own
    // decode is given.
    const std::string expect = row.contains("decoded") ? row["decoded"].get<std::string>() : text;
    CHECK(tok->decode(want) == expect);
  }
  CHECK(same == rows.size());

  const ChatTemplate tmpl = ChatTemplate::for_model(*model);
  CHECK(tmpl.name() == "chatml");
  CHECK(tmpl.default_system() == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  size_t chats = 0;
  for (const auto& p : ref["prompts"]) {
    const std::string text = p["text"].get<std::string>();
    const auto want = p["ids"].get<std::vector<int32_t>>();
    INFO("prompt " << p["name"].get<std::string>());
    if (p["kind"] == "chat") {
      // transformers' apply_chat_template(..., add_generation_prompt=True) rendering and its ids.
      std::vector<ChatMessage> msgs;
      for (const auto& m : p["messages"])
        msgs.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
      CHECK(tmpl.render(msgs, true) == text);
      CHECK(tok->encode(text) == want);
      // A lone user message is what kvbench's --chat prompts are: the default system message is added.
      if (msgs.size() == 1 && msgs[0].role == "user") CHECK(build_prompt(*model, *tok, msgs[0].content, true) == want);
      ++chats;
    } else {
      CHECK(build_prompt(*model, *tok, text, false) == want);  // no BOS: add_bos_token is false
    }
  }
  CHECK(chats == 2);
}

TEST_CASE("Qwen2.5-Coder logits and greedy continuations match transformers on the same GGUF",
          "[engine][model][qwen][reference]") {
  auto path = qwen_model_file();
  if (!path) return;
  auto model = ModelFile::open(*path);
  Engine e(*model);  // fp32 weights, as transformers' GGUF loader dequantizes them
  REQUIRE(e.weight_format() == WeightFormat::F32);
  const auto ref = qwen_fixture();
  const auto probe_ids = ref["probe_ids"].get<std::vector<int32_t>>();
  REQUIRE(probe_ids.size() == 16);
  const auto& prompts = ref["prompts"];
  REQUIRE(prompts.size() == 4);

  float worst = 0;
  size_t positions = 0, continuations = 0, identical = 0;
  for (const auto& p : prompts) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    const size_t n = ids.size();
    INFO("prompt " << p["name"].get<std::string>() << " (" << n << " tokens)");
    const auto& probes = p["probes"];
    REQUIRE(probes.back()["pos"].get<size_t>() == n - 1);
    // Earlier positions: the logits of a prefill of the prompt's first pos + 1 tokens.
    for (size_t k = 0; k + 1 < probes.size(); ++k) {
      const auto pos = probes[k]["pos"].get<size_t>();
      INFO("position " << pos);
      worst =
          std::max(worst, compare_position(e.prefill(std::span(ids).first(pos + 1)), probes[k], probe_ids, nullptr));
      ++positions;
    }
    // The longest prompt's last position also through decode steps over a cache of 1002 tokens.
    if (n > 512) {
      INFO("last position through 4 decode steps");
      e.prefill(std::span(ids).first(n - 4));
      std::vector<float> logits;
      for (size_t i = n - 4; i < n; ++i) logits = e.decode(ids[i]);
      worst = std::max(worst, compare_position(logits, probes.back(), probe_ids, &p["top20"]));
      ++positions;
    }
    auto logits = e.prefill(ids);
    {
      INFO("last position");
      REQUIRE(p["max_abs_logit"].get<float>() == probes.back()["max_abs_logit"].get<float>());
      worst = std::max(worst, compare_position(logits, probes.back(), probe_ids, &p["top20"]));
      CHECK(argmax(logits) == p["top20"][0][0].get<int32_t>());
      ++positions;
    }
    if (!p.contains("greedy")) continue;
    // Greedy decoding: 16 tokens, no stop at end-of-generation ids (as the fixture's).
    const auto greedy = p["greedy"].get<std::vector<int32_t>>();
    const auto margins = p["greedy_margins"].get<std::vector<float>>();
    REQUIRE(greedy.size() == 16);
    std::vector<int32_t> ours;
    for (size_t t = 0; t < greedy.size(); ++t) {
      ours.push_back(argmax(logits));
      if (ours.back() != greedy[t]) {
        // transformers' margin between its token and the next best at the step where ours parts.
        FAIL_CHECK("greedy continuation parts at token " << t << ": " << ours.back() << " instead of " << greedy[t]
                                                         << " (transformers' margin " << margins[t] << ")");
        break;
      }
      if (t + 1 < greedy.size()) logits = e.decode(ours.back());
    }
    CHECK(ours == greedy);
    ++continuations;
    identical += ours == greedy;
  }
  WARN("Qwen2.5-Coder vs transformers: worst max|diff| / max|logit| = " << worst << " over " << positions
                                                                        << " positions; identical greedy continuations "
                                                                        << identical << "/" << continuations);
  CHECK(continuations == 2);
}

TEST_CASE("Qwen2.5-Coder with gguf weights: its Q4_K, Q5_0, Q6_K and Q8_0 matrices multiplied in their blocks",
          "[engine][model][qwen]") {
  auto path = qwen_model_file();
  if (!path) return;
  auto model = ModelFile::open(*path);
  Engine fp32(*model), gguf(*model, {.weights = WeightFormat::GGUF});
  // 4.5 to 8.5 bits per weight against 32: under a quarter of the bytes, which holds only if the 133
  // Q5_0 matrices are read as blocks too (as bf16 they made the decode step read 37% of fp32's).
  CHECK(4 * gguf.decode_weight_bytes() < fp32.decode_weight_bytes());
  const auto ids = qwen_fixture()["prompts"][0]["ids"].get<std::vector<int32_t>>();
  std::vector<std::pair<std::vector<float>, std::vector<float>>> steps = {{gguf.prefill(ids), fp32.prefill(ids)}};
  for (int t = 0; t < 3; ++t) {
    const int32_t next = argmax(steps.back().second);
    steps.emplace_back(gguf.decode(next), fp32.decode(next));
  }
  float worst = 0;
  for (const auto& [got, want] : steps) {
    // Only the activations' 8-bit quantization (per block of 32 or 256) separates the two.
    const float diff = test::max_abs_diff(got, want);
    worst = std::max(worst, diff / test::max_abs(want));
    // The top token must agree unless fp32's two best are within twice the error of each other.
    std::vector<float> sorted = want;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    CHECK((argmax(got) == argmax(want) || sorted[0] - sorted[1] <= 2 * diff));
  }
  WARN("Qwen2.5-Coder gguf vs fp32 weights: worst max|diff| / max|logit| = " << worst << " over 4 steps");
  CHECK(worst < 0.03f);
}
