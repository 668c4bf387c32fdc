// KVQuant: calibration pieces and the quantizer against the authors' code (reference.py's fixture), the
// cache's packed format against what attention reads, and the offline step and method end to end.
#include <cmath>
#include <fstream>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "kernels/cpu/fp16.hpp"
#include "methods/kvquant/kvquant.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

// reference.py's generator, operation for operation.
double uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

std::vector<float> activations(uint64_t channel_seed, uint64_t seed, int rows, int channels,
                               std::initializer_list<int> outlier_channels) {
  std::vector<float> out(size_t(rows) * size_t(channels));
  for (int c = 0; c < channels; ++c) {
    double scale = 0.5 + 3.0 * uniform(channel_seed + 1, uint64_t(c));
    if (std::find(outlier_channels.begin(), outlier_channels.end(), c) != outlier_channels.end()) scale *= 10.0;
    const double shift = 2.0 * uniform(channel_seed + 2, uint64_t(c)) - 1.0;
    for (int n = 0; n < rows; ++n) {
      const uint64_t i = uint64_t(n) * uint64_t(channels) + uint64_t(c);
      double bell = 0;
      for (uint64_t j = 0; j < 4; ++j) bell += uniform(seed, 4 * i + j);
      bell -= 2.0;
      if (uniform(seed + 3, i) < 1.0 / 64) bell *= 6.0;
      out[i] = half_to_float(float_to_half(float(shift + scale * bell)));
    }
  }
  return out;
}

std::vector<float> fisher(uint64_t seed, int rows, int channels) {
  std::vector<float> out(size_t(rows) * size_t(channels));
  for (size_t i = 0; i < out.size(); ++i) {
    const double u = uniform(seed, i);
    out[i] = float((0.1 + u) * (0.1 + u));
  }
  return out;
}

// The normalised non-outliers and their weights, as SimQuant.quantize hands them to k-means, sorted.
void kmeans_points(const std::vector<float>& data, const std::vector<float>& w, int rows, int channels,
                   bool per_channel, double p, std::vector<double>& x, std::vector<double>& weight) {
  std::vector<std::pair<double, double>> pts;
  const int groups = per_channel ? channels : rows, len = per_channel ? rows : channels;
  std::vector<float> line(static_cast<size_t>(len));
  for (int g = 0; g < groups; ++g) {
    const auto at = [&](int i) {
      return per_channel ? size_t(i) * size_t(channels) + size_t(g) : size_t(g) * size_t(channels) + size_t(i);
    };
    for (int i = 0; i < len; ++i) line[size_t(i)] = data[at(i)];
    std::vector<float> sorted = line;
    std::sort(sorted.begin(), sorted.end());
    const double hi = percentile_sorted(sorted, p), lo = percentile_sorted(sorted, 1 - p);
    for (int i = 0; i < len; ++i) {
      const double v = (double(line[size_t(i)]) - (hi + lo) / 2) / ((hi - lo) / 2);
      if (std::abs(v) <= 1) pts.emplace_back(double(float(v)), double(w[at(i)]));
    }
  }
  std::sort(pts.begin(), pts.end());
  x.clear();
  weight.clear();
  for (auto [a, b] : pts) {
    x.push_back(a);
    weight.push_back(b);
  }
}

std::vector<float> floats(const nlohmann::json& j) { return j.get<std::vector<float>>(); }

// The registry-driven tests run the method on a random model with uniform 3-bit quantizers over [-4, 4].
std::map<std::string, std::string> uniform_quantizers(const ModelFile& model, const std::filesystem::path& dir) {
  const ModelConfig& c = model.config();
  KvquantQuantizers q;
  for (int l = 0; l < c.n_layers; ++l) {
    KvquantLayer& layer = q.layers.emplace_back();
    layer.k_upper.assign(size_t(c.n_kv_heads) * size_t(c.head_dim), float_to_half(4.0f));
    layer.k_lower.assign(layer.k_upper.size(), float_to_half(-4.0f));
    for (int i = 0; i < 8; ++i) layer.k_codebook.push_back(-0.875f + 0.25f * float(i));
    layer.v_codebook = layer.k_codebook;
  }
  auto body = kvquant_json(q);
  body["header"] = artifact_header("kvquant-nuq3", c, model.path());
  const std::string file = (dir / "kvquant_quantizers.json").string();
  write_artifact(file, body);
  return {{"quantizers", file}};
}
const bool test_artifacts_registered = test::register_method_test_artifacts("kvquant", uniform_quantizers);

}  // namespace

TEST_CASE("kvquant: calibration and quantizer against KVQuant's simquant (reference.py)", "[kvquant][kernels]") {
  const auto ref =
      nlohmann::json::parse(std::ifstream(test::source_path("methods/kvquant/fixtures/kvquant_reference.json")));
  const int n = ref["n"], channels = ref["channels"], rows = ref["rows"], bits = ref["bits"];
  const double share = 1.0 - ref["threshold"].get<double>(), p = kvquant_upper_fraction(share);
  REQUIRE(p == 0.995);
  const auto& seeds = ref["seeds"];
  const auto k_cal = activations(seeds["k"], seeds["k"], n, channels, {5, 40});
  const auto v_cal = activations(seeds["v"], seeds["v"], n, channels, {});

  SECTION("per-channel key thresholds are numpy's percentiles") {
    const auto upper = floats(ref["k_upper"]), lower = floats(ref["k_lower"]);
    std::vector<float> column(static_cast<size_t>(n));
    for (int c = 0; c < channels; ++c) {
      for (int t = 0; t < n; ++t) column[size_t(t)] = k_cal[size_t(t) * size_t(channels) + size_t(c)];
      std::sort(column.begin(), column.end());
      CHECK(float(percentile_sorted(column, p)) == upper[size_t(c)]);
      CHECK(float(percentile_sorted(column, 1 - p)) == lower[size_t(c)]);
    }
  }

  SECTION("the Fisher-weighted codebooks reach scikit-learn's k-means objective") {
    for (const bool keys : {true, false}) {
      INFO((keys ? "keys" : "values"));
      std::vector<double> x, w;
      kmeans_points(keys ? k_cal : v_cal, fisher(keys ? seeds["k_fisher"] : seeds["v_fisher"], n, channels), n,
                    channels, keys, p, x, w);
      WeightedHistogram h;
      for (size_t i = 0; i < x.size(); ++i) h.add(x[i], w[i]);
      std::vector<double> bx, bw;
      h.points(bx, bw);
      const auto ours = weighted_kmeans_1d(bx, bw, 1 << bits, 0);
      const double reference = ref[keys ? "k_inertia" : "v_inertia"].get<double>();
      const double mine = kmeans_inertia(x, w, ours);
      const auto theirs = floats(ref[keys ? "k_codebook" : "v_codebook"]);
      CHECK(kmeans_inertia(x, w, std::vector<double>(theirs.begin(), theirs.end())) == Approx(reference).epsilon(1e-6));
      // Both are local optima of the same objective: ours within 1% of the reference's.
      CAPTURE(mine, reference, ours, theirs);
      CHECK(mine <= reference * 1.01);
    }
  }

  SECTION("quantized rows equal the reference's bit for bit, and decode from their codes") {
    KvquantLayer q;
    for (float x : floats(ref["k_upper"])) q.k_upper.push_back(float_to_half(x));
    for (float x : floats(ref["k_lower"])) q.k_lower.push_back(float_to_half(x));
    q.k_codebook = floats(ref["k_codebook"]);
    q.v_codebook = floats(ref["v_codebook"]);
    const auto k_test = activations(seeds["k"], seeds["k_test"], rows, channels, {5, 40});
    const auto v_test = activations(seeds["v"], seeds["v_test"], rows, channels, {});
    const auto k_ref = ref["k_out_fp16"].get<std::vector<uint16_t>>();
    const auto v_ref = ref["v_out_fp16"].get<std::vector<uint16_t>>();
    size_t k_outliers = 0, v_outliers = 0, k_same = 0, v_same = 0;
    std::vector<float> out(static_cast<size_t>(channels)), back(static_cast<size_t>(channels));
    for (int t = 0; t < rows; ++t) {
      const size_t at = size_t(t) * size_t(channels);
      KvquantRow row;
      kvquant_keys(q, k_test.data() + at, channels, out.data(), &row);
      k_outliers += row.outliers.size();
      kvquant_decode_keys(q, row, 0, channels, back.data());
      for (int c = 0; c < channels; ++c) {
        k_same += float_to_half(out[size_t(c)]) == k_ref[at + size_t(c)];
        CHECK(back[size_t(c)] == out[size_t(c)]);
      }
      kvquant_values(q, share, v_test.data() + at, channels, out.data(), &row);
      v_outliers += row.outliers.size();
      kvquant_decode_values(q, row, 0, channels, back.data());
      for (int c = 0; c < channels; ++c) {
        v_same += float_to_half(out[size_t(c)]) == v_ref[at + size_t(c)];
        CHECK(back[size_t(c)] == out[size_t(c)]);
      }
    }
    CHECK(k_same == size_t(rows) * size_t(channels));
    CHECK(v_same == size_t(rows) * size_t(channels));
    CHECK(k_outliers == ref["k_outliers"].get<size_t>());
    CHECK(v_outliers == ref["v_outliers"].get<size_t>());
  }
}

TEST_CASE("kvquant: the cache holds the packed format and reads what the quantizer wrote", "[kvquant]") {
  const int heads = 3, d = 16, channels = heads * d, n = 40;
  KvquantLayer q;
  for (int c = 0; c < channels; ++c) {
    q.k_upper.push_back(float_to_half(2.0f + 0.1f * float(c % 5)));
    q.k_lower.push_back(float_to_half(-1.5f - 0.1f * float(c % 3)));
  }
  for (int i = 0; i < 8; ++i) {
    q.k_codebook.push_back(-0.9f + 0.25f * float(i));
    q.v_codebook.push_back(-0.8f + 0.23f * float(i));
  }
  auto layer = std::make_shared<const KvquantLayer>(q);
  auto batch = std::make_shared<KvquantBatch>();
  auto k = test::randn(size_t(n) * channels, 3, 1.2f), v = test::randn(size_t(n) * channels, 4);
  std::vector<float> kq(k.size()), vq(v.size());
  for (int t = 0; t < n; ++t) {
    batch->positions.push_back(100 + t);
    KvquantRow& rk = batch->k.emplace_back();
    KvquantRow& rv = batch->v.emplace_back();
    kvquant_keys(q, k.data() + size_t(t) * channels, channels, kq.data() + size_t(t) * channels, &rk);
    kvquant_values(q, 0.01, v.data() + size_t(t) * channels, channels, vq.data() + size_t(t) * channels, &rv);
  }
  size_t outliers = 0;
  for (int h = 0; h < heads; ++h) {
    KvquantSegment seg(layer, batch, 3, 0.01, d, h * d);
    for (int t = 0; t < n; ++t)
      REQUIRE(seg.append_token(kq.data() + size_t(t) * channels + size_t(h) * d,
                               vq.data() + size_t(t) * channels + size_t(h) * d, 100 + t));
    CHECK(seg.format() == "kvquant(nuq3,1%)");
    outliers += seg.outliers();
    // 16 channels x 3 bits = 6 bytes per token and kind; 6 bytes an outlier; row starts and the value scale.
    CHECK(seg.bytes() == size_t(n) * (2 * 6 + 2 * 4 + 8) + seg.outliers() * 6);
    std::vector<float> kd(static_cast<size_t>(d)), vd(static_cast<size_t>(d)), scores(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) {
      seg.decode(size_t(t), kd.data(), vd.data());
      for (int i = 0; i < d; ++i) {
        CHECK(kd[size_t(i)] == kq[size_t(t) * channels + size_t(h * d + i)]);
        CHECK(vd[size_t(i)] == vq[size_t(t) * channels + size_t(h * d + i)]);
      }
    }
    std::vector<float> unit(static_cast<size_t>(d), 0.0f);
    unit[2] = 1.0f;
    seg.logits(unit.data(), scores.data());
    for (int t = 0; t < n; ++t) CHECK(scores[size_t(t)] == kq[size_t(t) * channels + size_t(h * d + 2)]);
    test::require_error([&] { seg.append_token(kq.data(), vq.data(), 7); }, {"position 7", "quantizer"});
  }
  size_t expected = 0;
  for (int t = 0; t < n; ++t) expected += batch->k[size_t(t)].outliers.size() + batch->v[size_t(t)].outliers.size();
  CHECK(outliers == expected);
  // The value rows keep about 1% (two of 48 channels per token: the extremes) in fp16.
  for (const auto& r : batch->v) CHECK(r.outliers.size() == 2);
}

TEST_CASE("kvquant: calibration and the method on the default model", "[kvquant][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path || !test::setup_data("python-docs")) return;
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine engine(*model);
  const test::TempDir dir("kvquant");
  const auto file = (dir / "quantizers.json").string();

  test::require_error(
      [&] {
        MethodRegistry::get().create("kvquant", {{"quantizers", file}}, engine.config());
      },
      {"kvbench calibrate kvquant"});
  {
    const OfflineStep step = MethodRegistry::get().offline_step("calibrate", "kvquant");
    Params options(step.options, {{"samples", "2"}, {"seq_len", "128"}}, "kvbench calibrate kvquant");
    CalibrationContext ctx{*model, *tok, engine, std::move(options), file, default_data_dir(), false};
    step.run(ctx);
  }
  const LoadedArtifact a = load_artifact("kvquant-nuq3", file, engine.config(), "");
  const KvquantQuantizers q = kvquant_from_json(a.body, engine.config(), file);
  REQUIRE(q.layers.size() == size_t(engine.config().n_layers));
  for (const auto& l : q.layers) {
    REQUIRE(l.k_codebook.size() == 8);
    CHECK(l.k_codebook.front() >= -1.0f);
    CHECK(l.k_codebook.back() <= 1.0f);
    CHECK(l.v_codebook.front() < l.v_codebook.back());
  }
  test::require_error(
      [&] {
        MethodRegistry::get().create("kvquant", {{"quantizers", file}, {"outliers", "0.02"}}, engine.config());
      },
      {file, "outliers", "2%"});

  const auto ids = build_prompt(*model, *tok, "The capital of France is Paris. The capital of Italy is", false);
  GenerateOptions opt;
  opt.max_new_tokens = 8;
  opt.stop_at_eog = false;
  auto m = MethodRegistry::get().create("kvquant", {{"quantizers", file}}, engine.config());
  MethodRunner runner(*m, KvBudget{});
  const auto g = generate(engine, *tok, ids, opt, &runner);
  CHECK(g.tokens.size() == 8);
  // Per token and KV head of 64 channels: 2 x 24 bytes of codes, 8 of row starts, 8 of value scale, and
  // 6 per outlier (~1% of the 128 numbers; more where the prompt leaves the calibration's range).
  const double share = double(runner.prefill_kv_bytes()) / double(engine.full_kv_bytes(ids.size()));
  const double row = 2.0 * 64 * double(kv_dtype_bytes(engine.kv_dtype()));
  CHECK(share > 64.0 / row);
  CHECK(share < (64.0 + 0.1 * 128 * 6) / row);
  CHECK(m->artifacts()["quantizers"]["file"] == file);
}
