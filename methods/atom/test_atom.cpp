// Atom against Atom's own quantizers and its model (reference.py), and what the method guarantees itself.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "harness/engine/engine.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/base64.hpp"
#include "methods/atom/atom.hpp"
#include "methods/atom/gptq.hpp"
#include "reference_logits.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

std::vector<float> from_hex(const std::string& hex) {
  std::vector<float> out(hex.size() / 8);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b)
      bits |= uint32_t(std::stoul(hex.substr(i * 8 + size_t(b) * 2, 2), nullptr, 16)) << (8 * b);
    std::memcpy(&out[i], &bits, 4);
  }
  return out;
}

nlohmann::json reference() {
  std::ifstream in(test::source_path("methods/atom/fixtures/atom_ref.json"));
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

// The calibration's sequences in a file `kvbench calibrate atom -o ids=` reads.
// The settings of a fixture case as Atom's quantizers take them.
AtomQuant quant_of(const nlohmann::json& c) {
  return {.bits = c["bits"],
          .group = c["group"],
          .sym = c["sym"],
          .clip = c["clip"].get<float>(),
          .keeper = c["keeper"],
          .keeper_bits = c["keeper_bits"],
          .channel_group = c["channel_group"]};
}

// x^T x of the rows x[., cols], in fp64.
std::vector<double> gram(const std::vector<float>& x, int cols) {
  std::vector<double> h(size_t(cols) * cols, 0.0);
  for (size_t t = 0; t < x.size() / size_t(cols); ++t)
    for (int i = 0; i < cols; ++i)
      for (int j = 0; j < cols; ++j) h[size_t(i) * cols + j] += double(x[t * cols + i]) * x[t * cols + j];
  return h;
}

std::string write_ids(const std::filesystem::path& dir, const nlohmann::json& sequences) {
  const std::string file = (dir / "atom_ids.json").string();
  std::ofstream(file) << nlohmann::json{{"sequences", sequences}}.dump();
  return file;
}

// A reorder index of random permutations, for random models (which have no tokenizer to calibrate with):
// the registry-wide tests' have 64 hidden and 48 or 96 MLP channels, so activations and weights per row
// and 16 outliers.
std::map<std::string, std::string> tiny_index(const ModelFile& model, const std::filesystem::path& dir) {
  const ModelConfig& c = model.config();
  std::mt19937 rng(3);
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < c.n_layers; ++l) {
    nlohmann::json layer;
    for (MatrixInput site : kAtomSites) {
      const int width = atom_site_width(c, site);
      std::vector<int> perm(static_cast<size_t>(width));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      layer[matrix_input_name(site)] = perm;
    }
    layers.push_back(layer);
  }
  nlohmann::json body = {{"layers", layers}, {"header", artifact_header("atom", c, model.path())}};
  const std::string out = (dir / "atom_index.json").string();
  write_artifact(out, body);
  return {{"index", out}, {"act_group_size", "0"}, {"weight_group_size", "0"}, {"keeper", "16"}};
}
const bool test_artifacts_registered = test::register_method_test_artifacts("atom", tiny_index);

// Atom run through its runner, with the rows entering one layer's site recorded (appended, pass after pass)
// before Atom quantizes them or, `quantized`, after.
class LayerInputTap final : public PrefillObserver, public LinearTransform {
 public:
  LayerInputTap(Method& m, int layer, MatrixInput site, bool quantized = false)
      : runner_(m, KvBudget{}), m_(m), layer_(layer), site_(site), quantized_(quantized) {}
  PrefillNeeds needs() const override { return runner_.needs(); }
  KvTransform* kv_transform() override { return runner_.kv_transform(); }
  LinearTransform* linear_transform() override { return this; }
  void on_layer(const PrefillView& view, LayerCache& cache) override { runner_.on_layer(view, cache); }
  std::string weights_key() const override { return m_.linear_transform()->weights_key(); }
  void weights(int layer, Matrix m, float* w, int rows, int cols) override {
    m_.linear_transform()->weights(layer, m, w, rows, cols);
  }
  void inputs(int layer, MatrixInput site, float* x, int n, int cols) override {
    const bool here = layer == layer_ && site == site_;
    if (here && !quantized_) seen.insert(seen.end(), x, x + size_t(n) * cols);
    m_.linear_transform()->inputs(layer, site, x, n, cols);
    if (here && quantized_) seen.insert(seen.end(), x, x + size_t(n) * cols);
  }
  std::vector<float> seen;

 private:
  MethodRunner runner_;
  Method& m_;
  int layer_;
  MatrixInput site_;
  bool quantized_;
};

}  // namespace

// reference.py runs Atom's quantize_activation_wrapper, QLinearLayer.quant and quantize_tensor (its KV
// quantizer's call) on random float32 inputs with outliers: kvbench's must give the same floats, bit for bit.
TEST_CASE("atom: quantizers equal Atom's own, bit for bit", "[atom]") {
  const auto ref = reference();
  int cases = 0;
  for (const auto& c : ref["quantizers"]) {
    INFO(c["name"].get<std::string>());
    const AtomQuant q = quant_of(c);
    std::vector<float> x = from_hex(c["x"]);
    const std::vector<float> want = from_hex(c["y"]);
    const int rows = c["rows"], cols = c["cols"];
    REQUIRE(x.size() == size_t(rows) * cols);
    const std::string kind = c["kind"];
    if (kind == "activations")
      atom_quantize_rows(x.data(), rows, cols, q);
    else if (kind == "weights")
      atom_quantize_weight(x.data(), rows, cols, q);
    else
      for (int r = 0; r < rows; ++r)
        atom_quantize_group(x.data() + size_t(r) * cols, size_t(cols), q.bits, false, q.clip);
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += std::memcmp(&x[i], &want[i], 4) != 0;
    CHECK(differ == 0);
    CHECK(x != from_hex(c["x"]));  // the case quantizes something
    ++cases;
  }
  CHECK(cases == 10);
}

TEST_CASE("atom: reordered quantization is the reordered row's, put back", "[atom]") {
  const int cols = 96;
  std::vector<float> x = test::randn(2 * cols, 5);
  std::vector<int> perm(cols);
  for (int j = 0; j < cols; ++j) perm[size_t(j)] = (j * 37 + 11) % cols;
  const AtomQuant q{.bits = 4, .group = 32, .sym = true, .clip = 0.9f, .keeper = 16, .keeper_bits = 8};
  std::vector<float> in_order(x.size());
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < cols; ++j) in_order[size_t(r) * cols + j] = x[size_t(r) * cols + size_t(perm[size_t(j)])];
  atom_quantize_rows(in_order.data(), 2, cols, q);
  std::vector<float> scratch, got = x;
  atom_quantize_rows_in_order(got.data(), 2, cols, perm, q, scratch);
  for (int r = 0; r < 2; ++r)
    for (int j = 0; j < cols; ++j)
      CHECK(got[size_t(r) * cols + size_t(perm[size_t(j)])] == in_order[size_t(r) * cols + j]);
  // The weights' columns in the same order: a product of quantized rows and weights is unchanged by the order.
  std::vector<float> w = test::randn(4 * cols, 6), wp(w.size());
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < cols; ++j) wp[size_t(r) * cols + j] = w[size_t(r) * cols + size_t(perm[size_t(j)])];
  const AtomQuant wq{.bits = 4, .group = 32, .sym = true, .clip = 0.85f, .keeper = 16, .channel_group = 2};
  atom_quantize_weight(wp.data(), 4, cols, wq);
  atom_quantize_weight_in_order(w.data(), 4, cols, {}, perm, wq);
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < cols; ++j) CHECK(w[size_t(r) * cols + size_t(perm[size_t(j)])] == wp[size_t(r) * cols + j]);
  CHECK(atom_order(std::vector<double>{3, 1, 2, 1}) == std::vector<int>{1, 3, 2, 0});
}

// reference.py's hashed inputs: (mix32(tag * 1000003 + r * 4099 + c) % 2001 - 1000) / denom, every
// outlier_every-th column from 7 sixteen times larger.
uint32_t mix32(uint32_t i) {
  i = (i ^ 61u) ^ (i >> 16);
  i += i << 3;
  i ^= i >> 4;
  i *= 0x27D4EB2Du;
  return i ^ (i >> 15);
}
std::vector<float> hashed(uint32_t tag, int rows, int cols, double denom, int outlier_every) {
  std::vector<float> a(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      double v = double(int(mix32(tag * 1000003u + uint32_t(r) * 4099u + uint32_t(c)) % 2001u) - 1000) / denom;
      if (outlier_every && c >= 7 && (c - 7) % outlier_every == 0) v *= 16;
      a[size_t(r) * cols + c] = float(v);
    }
  return a;
}

// Atom's GPTQ class on the same weight and inputs (a grouped case whose group starts fall inside GPTQ's
// blocks, a per-row asymmetric 3-bit case with fp16 outliers and an unused channel that holds each row's
// range, channel groups of 4 without outliers and a group without negative weights). Its Hessian and Cholesky
// factors are float32, kvbench's fp64: every code is the same (another code is a grid step away, 1e-3 or more
// here), and the values differ by rounding only (of scales found from updated columns, of the kept outliers).
TEST_CASE("atom: GPTQ equals Atom's gptq.py", "[atom]") {
  const nlohmann::json ref = reference();
  REQUIRE(ref["gptq"].size() == 3);
  for (const auto& c : ref["gptq"]) {
    INFO(c["name"].get<std::string>());
    const int rows = c["rows"], cols = c["cols"], n = c["tokens"], dead = c["dead"];
    std::vector<float> x = hashed(1, n, cols, 256.0, 41), w = hashed(2, rows, cols, 8192.0, 0);
    if (dead >= 0) {
      for (int t = 0; t < n; ++t) x[size_t(t) * cols + size_t(dead)] = 0;
      for (int r = 0; r < rows; ++r) w[size_t(r) * cols + size_t(dead)] *= 16;
    }
    for (int r = 0; r < c["nonneg"][0].get<int>(); ++r)
      for (int j = 0; j < c["nonneg"][1].get<int>(); ++j) w[size_t(r) * cols + j] = std::abs(w[size_t(r) * cols + j]);
    const std::vector<float> want = from_hex(c["q"]);
    const std::vector<double> h = gram(x, cols);
    const AtomQuant q = quant_of(c);
    const AtomGptqWeight g = atom_gptq(w, rows, cols, h, q, 0.01);
    std::vector<float> got(w.size());
    g.dequantize(got.data());
    CHECK(test::max_abs_diff(got, want) <= 1e-5f);
    // The artifact's form gives back the same weight.
    const AtomGptqWeight back = atom_gptq_from_json(atom_gptq_to_json(g), rows, cols, q, "case");
    std::vector<float> again(w.size());
    back.dequantize(again.data());
    CHECK(again == got);
  }
}

// The whole method on the default model against reference.py: the index calibrated on the reference's
// windows is Atom's (its torch.sort of a float32 statistic may only swap neighbours whose statistics are
// equal to float32's precision); on Atom's own index, the logits over a prefill and 16 forced decode steps are Atom's
// where the model is static (its weights alone), and with every quantizer what enters layer 1 is Atom's.
TEST_CASE("atom: matches Atom's W4A4 KV4 model (reference.py)", "[atom][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  const auto ref = reference();
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine engine(*model);
  const test::TempDir dir("atom_ref");
  const std::string index = (dir / "index.json").string();
  const auto body = test::calibrate("atom", engine, *model, *tok,
                                    {{"ids", write_ids(dir.path(), ref["calibration"]["sequences"])}}, index);
  size_t swapped = 0, compared = 0;
  for (const auto& [layer, sites] : ref["calibration"]["layers"].items())
    for (const auto& [site, want] : sites.items()) {
      INFO("layer " << layer << " " << site);
      const auto got = body["layers"][size_t(std::stoi(layer))][site].template get<std::vector<int>>();
      const auto order = want["order"].get<std::vector<int>>();
      const std::vector<float> stat = from_hex(want["stat"]);
      REQUIRE(got.size() == order.size());
      for (size_t j = 0; j < got.size(); ++j) {
        ++compared;
        if (got[j] == order[j]) continue;
        ++swapped;
        const float a = stat[size_t(got[j])], b = stat[size_t(order[j])];
        CHECK(std::abs(a - b) <= 1e-5f * std::max(a, b));
      }
    }
  INFO(swapped << " of " << compared << " places hold channels of equal statistics in another order");
  CHECK(swapped * 1000 < compared);
  // Over every layer, only neighbours of equal statistics may trade places. They change which rows of gate
  // and up share a scale, so the comparisons below run on the reference's own index.
  nlohmann::json own_index = body;
  size_t traded = 0, places = 0;
  for (size_t l = 0; l < ref["calibration"]["index"].size(); ++l)
    for (const auto& [site, b64] : ref["calibration"]["index"][l].items()) {
      const std::vector<uint8_t> bytes = base64_decode(b64.get<std::string>(), "index");
      std::vector<int> want(bytes.size() / 2);
      for (size_t j = 0; j < want.size(); ++j) want[j] = bytes[2 * j] | bytes[2 * j + 1] << 8;
      const auto got = body["layers"][l][site].template get<std::vector<int>>();
      REQUIRE(got.size() == want.size());
      for (size_t j = 0; j < got.size(); ++j, ++places) {
        if (got[j] == want[j]) continue;
        ++traded;
        INFO("layer " << l << " " << site << " place " << j);
        CHECK(((j + 1 < got.size() && got[j] == want[j + 1] && got[j + 1] == want[j]) ||
               (j > 0 && got[j] == want[j - 1] && got[j - 1] == want[j])));
      }
      own_index["layers"][l][site] = want;
    }
  INFO(traded << " of " << places << " places traded between neighbours");
  CHECK(traded * 1000 < places);
  write_artifact(index, own_index);

  // The weights alone (abits 16): static, so both sides agree to float32's rounding over the whole model.
  const std::map<std::string, std::string> p = {
      {"index", index}, {"act_group_size", "64"}, {"weight_group_size", "64"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(p.begin(), p.end());
    return MethodRegistry::get().create("atom", extra, engine.config());
  };
  constexpr double kTol = 1e-3;
  auto weights_only = with({{"abits", "16"}});
  const test::ForcedGaps w = test::forced_gaps(engine, weights_only.get(), ref, "atom_weights", kTol);
  INFO("weights alone: largest logit difference to Atom's " << w.to_method << ", to the unmodified model "
                                                            << w.to_full);
  CHECK(w.to_method < kTol);
  CHECK(w.to_full > 100 * kTol);

  // Layer 1's input: behind it every quantizer of layer 0, whose inputs are exact on both sides. Its first
  // 10 tokens: at token 10 one outlier of the attention's input lands exactly halfway between two INT8 codes
  // in the reference's float32 (x / s = k + 1/2), so float32's last bit decides its code there and, through
  // that token's keys and values, every later token's.
  auto atom = with({});
  LayerInputTap tap(*atom, 1, MatrixInput::Attention);
  const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  engine.prefill(std::span(ids).first(ref["prefill"].get<size_t>()), &tap);
  const std::vector<float> want = from_hex(ref["layer1_input"]);
  REQUIRE(want.size() == 10 * size_t(engine.config().hidden));
  REQUIRE(tap.seen.size() >= want.size());
  float worst = 0;
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(tap.seen[i] - want[i]));
  INFO("layer 1's input: largest difference " << worst << " of " << test::max_abs(want));
  CHECK(worst < 1e-5f * test::max_abs(want));
}

TEST_CASE("atom: at 16 bits it is the model, and its cache charges codes, scales and zero points", "[atom][model]") {
  const test::TempDir dir("atom_identity");
  auto model = ModelFile::open(test::tiny_random_model(dir, "llama"));
  Engine engine(*model);
  std::vector<int32_t> ids(30);
  std::mt19937 rng(8);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 300);
  const auto want = engine.prefill(ids);
  auto off = MethodRegistry::get().create(
      "atom", {{"wbits", "16"}, {"abits", "16"}, {"reorder", "false"}, {"act_group_size", "0"}}, engine.config());
  MethodRunner r_off(*off, KvBudget{});
  CHECK(engine.prefill(ids, &r_off) == want);
  CHECK(engine.kv_bytes() == engine.full_kv_bytes(ids.size()));

  const auto params = tiny_index(*model, dir.path());
  auto on = MethodRegistry::get().create("atom", params, engine.config());
  MethodRunner r_on(*on, KvBudget{});
  const auto got = engine.prefill(ids, &r_on);
  CHECK(got != want);
  const ModelConfig& c = engine.config();
  // Per token, layer and KV head: K and V each 64 dimensions x 4 bits + an fp16 scale and zero point.
  CHECK(engine.kv_bytes() == ids.size() * size_t(c.n_layers) * c.n_kv_heads * 2 * (size_t(c.head_dim) / 2 + 4));
  engine.decode(7);
  CHECK(engine.kv_bytes() == (ids.size() + 1) * size_t(c.n_layers) * c.n_kv_heads * 2 * (size_t(c.head_dim) / 2 + 4));
}

TEST_CASE("atom: errors name the parameter, the width and the file", "[atom]") {
  const test::TempDir dir("atom_errors");
  auto model = ModelFile::open(test::tiny_random_model(dir, "llama"));
  const ModelConfig& c = model->config();
  auto make = [&](std::map<std::string, std::string> p) { MethodRegistry::get().create("atom", p, c); };
  test::require_error(
      [&] {
        make({{"reorder", "false"}, {"act_group_size", "256"}});
      },
      {"act_group_size 256 does not divide the 128 channels entering the attention products",
       "hidden 128, attention output 128, MLP hidden 256"});
  test::require_error(
      [&] {
        make({{"reorder", "false"}, {"weight_group_size", "384"}});
      },
      {"weight_group_size 384 does not divide the 128 channels"});
  test::require_error(
      [&] {
        make({{"reorder", "false"}, {"keeper", "200"}});
      },
      {"keeper 200 exceeds the 128 channels of attention"});
  test::require_error(
      [&] {
        make({{"reorder", "false"}, {"weight_channel_group", "3"}});
      },
      {"weight_channel_group 3 does not divide the 128 rows of the q matrices"});
  // Found by an audit: gptq= beside weights=rtn was ignored without a word.
  test::require_error(
      [&] {
        make({{"reorder", "false"}, {"gptq", (dir / "g.json").string()}});
      },
      {"gptq= is read only with weights=gptq", "weights is rtn"});
  std::map<std::string, std::string> with_index = {{"index", (dir / "missing.json").string()}};
  test::require_error([&] { make(with_index); }, {"missing.json", "kvbench calibrate atom"});
  // A file whose index repeats a channel.
  auto p = tiny_index(*model, dir.path());
  std::ifstream in(p["index"]);
  auto body = nlohmann::json::parse(in);
  body["layers"][1]["mlp_hidden"][5] = body["layers"][1]["mlp_hidden"][6];
  CHECK_NOTHROW(make(p));
  const std::string bad = (dir / "bad.json").string();
  write_artifact(bad, body);
  with_index["index"] = bad;
  test::require_error([&] { make(with_index); }, {"bad.json: layers[1].mlp_hidden", "permutation of the 256 channels"});
}

// `kvbench calibrate atom-gptq` on a random model, against GPTQ run here on Hessians taken as the driver must
// take them: layer 0's (every matrix) from the model with Atom's activations and KV cache quantized and its
// own weights; layers 1 and 2's q, k and v from the model whose earlier layers run the GPTQ weights. Then the
// method runs those weights, and refuses them for another setting.
TEST_CASE("atom: calibrate atom-gptq quantizes layer by layer on the quantized model", "[atom]") {
  const test::TempDir dir("atom_gptq");
  auto model = ModelFile::open(test::tiny_random_model(dir, "llama"));
  const ModelConfig& c = model->config();
  Engine engine(*model);
  const auto tok = load_tokenizer_file(test::source_path("tests/fixtures/tokenizer/synthetic/qwen2.json"));
  std::mt19937 rng(11);
  nlohmann::json seqs = nlohmann::json::array();
  for (int s = 0; s < 3; ++s) {
    std::vector<int> ids(40);
    for (int& id : ids) id = int(rng() % uint32_t(c.vocab_size));
    seqs.push_back(ids);
  }
  const std::string ids = write_ids(dir.path(), seqs);
  std::map<std::string, std::string> p = tiny_index(*model, dir.path());
  for (const auto& [k, v] : {std::pair{"act_group_size", "64"}, {"weight_group_size", "64"}, {"keeper", "16"}})
    p[k] = v;
  std::map<std::string, std::string> options = p;
  options["ids"] = ids;
  const std::string out = (dir / "gptq.json").string();
  const nlohmann::json body = test::calibrate("atom-gptq", engine, *model, *tok, options, out);
  CHECK(body["header"]["settings"]["keeper"] == "16");
  CHECK(body["header"]["calibration"]["tokens"] == 120);

  std::ifstream in(p["index"]);
  const nlohmann::json index = nlohmann::json::parse(in);
  AtomReorder reorder;
  for (const auto& layer : index["layers"]) {
    auto& sites = reorder.layers.emplace_back();
    for (MatrixInput s : kAtomSites) sites[size_t(s)] = layer[matrix_input_name(s)].get<std::vector<int>>();
  }
  const AtomQuant wq{.bits = 4, .group = 64, .sym = true, .clip = 0.85f, .keeper = 16, .channel_group = 2};
  auto check = [&](std::map<std::string, std::string> run, int layer, std::initializer_list<Matrix> mats) {
    const auto atom = MethodRegistry::get().create("atom", run, c);
    for (Matrix mat : mats) {
      INFO("layer " << layer << " " << matrix_name(mat));
      const MatrixInput site = input_of(mat);
      const int cols = atom_site_width(c, site);
      LayerInputTap tap(*atom, layer, site, true);
      for (const auto& s : seqs) engine.prefill(s.get<std::vector<int32_t>>(), &tap);
      const std::vector<double> h = gram(tap.seen, cols);
      const std::vector<float> w = model->load_f32(matrix_tensor(layer, mat));
      const int rows = int(w.size()) / cols;
      const std::vector<int> row_order = atom_row_order(c, reorder, layer, mat);
      const std::vector<int>& perm = reorder.of(layer, site);
      std::vector<float> ordered;
      atom_gather(w.data(), rows, cols, row_order, perm, ordered);
      std::vector<double> hp(size_t(cols) * cols);
      for (int i = 0; i < cols; ++i)
        for (int j = 0; j < cols; ++j) hp[size_t(i) * cols + j] = h[size_t(perm[size_t(i)]) * cols + perm[size_t(j)]];
      std::vector<float> want(w.size()), got(w.size());
      atom_gptq(ordered, rows, cols, hp, wq, 0.01).dequantize(want.data());
      atom_gptq_from_json(body["layers"][size_t(layer)][matrix_name(mat)], rows, cols, wq, "artifact")
          .dequantize(got.data());
      CHECK(test::max_abs_diff(got, want) <= 1e-5f);
    }
  };
  std::map<std::string, std::string> weights_as_they_are = p;
  weights_as_they_are["wbits"] = "16";
  check(weights_as_they_are, 0, {Matrix::Q, Matrix::K, Matrix::V, Matrix::O, Matrix::Gate, Matrix::Up, Matrix::Down});
  std::map<std::string, std::string> with_gptq = p;
  with_gptq["weights"] = "gptq";
  with_gptq["gptq"] = out;
  for (int layer : {1, 2}) check(with_gptq, layer, {Matrix::Q, Matrix::K, Matrix::V});

  // The method on those weights: not the rounded ones; and not for another setting.
  const auto rtn = MethodRegistry::get().create("atom", p, c),
             gptq = MethodRegistry::get().create("atom", with_gptq, c);
  MethodRunner r_rtn(*rtn, KvBudget{}), r_gptq(*gptq, KvBudget{});
  const std::vector<int32_t> prompt = seqs[0].get<std::vector<int32_t>>();
  const std::vector<float> a = engine.prefill(prompt, &r_rtn), b = engine.prefill(prompt, &r_gptq);
  CHECK(a != b);
  CHECK(std::all_of(b.begin(), b.end(), [](float v) { return std::isfinite(v); }));
  CHECK(gptq->artifacts()["gptq"]["file"] == out);
  with_gptq["w_clip_ratio"] = "0.9";
  test::require_error(
      [&] { MethodRegistry::get().create("atom", with_gptq, c); },
      {"gptq.json: GPTQ weights made with w_clip_ratio", "kvbench calibrate atom-gptq MODEL -o w_clip_ratio=0.9"});
}
