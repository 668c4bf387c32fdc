#pragma once
// Shared helpers for the Catch2 tests: fixture paths, JSONL reading, and access to the model files
// that scripts/setup.sh fetches (tests needing them skip with a warning when they are absent, and
// fail instead when KVBENCH_REQUIRE_MODELS=1, as CI sets it).
#include <catch2/catch.hpp>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/backend.hpp"
#include "harness/model/random_model.hpp"
#include "harness/task/task.hpp"
#include "harness/util/error.hpp"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <system_error>
#include <vector>

namespace kvb {
class ModelFile;
}

namespace kvb::test {

inline std::string source_path(const std::string& rel) { return std::string(KVBENCH_SOURCE_DIR) + "/" + rel; }

inline std::string fixture(const std::string& rel) { return source_path("tests/fixtures/" + rel); }

// Parameters under which the registry-driven tests run a method on synthetic layers when its defaults
// need a real model's artifact (scores=uniform for HeadKV) or a real head size. A method's own test
// file registers them: const bool reg = test::register_method_test_params("headkv", {{"scores", "uniform"}});
inline std::map<std::string, std::map<std::string, std::string>>& method_test_params() {
  static std::map<std::string, std::map<std::string, std::string>> params;
  return params;
}
inline bool register_method_test_params(const std::string& method, std::map<std::string, std::string> params) {
  method_test_params()[method] = std::move(params);
  return true;
}
// Parameters naming files a method reads that must be made for the model at hand (DynaKV's trained
// maps): its test file registers a maker, which writes them under `dir` and returns the parameters.
using MethodTestArtifacts =
    std::function<std::map<std::string, std::string>(const ModelFile& model, const std::filesystem::path& dir)>;
inline std::map<std::string, MethodTestArtifacts>& method_test_artifacts() {
  static std::map<std::string, MethodTestArtifacts> makers;
  return makers;
}
inline bool register_method_test_artifacts(const std::string& method, MethodTestArtifacts maker) {
  method_test_artifacts()[method] = std::move(maker);
  return true;
}
// The test parameters of `method` (none if it registered none) joined to `extra`.
inline std::map<std::string, std::string> method_test_params(const std::string& method,
                                                             std::map<std::string, std::string> extra = {}) {
  if (const auto it = method_test_params().find(method); it != method_test_params().end())
    for (const auto& [k, v] : it->second) extra.emplace(k, v);
  return extra;
}

// The FNV-1a 64-bit hash of kept positions as int32 little-endian bytes, in decimal: how the reference
// scripts (tools/reference/kv_selection.py, methods/keydiff/reference.py) record kept sets.
inline std::string positions_hash(const std::vector<int32_t>& pos) {
  uint64_t h = 14695981039346656037ull;
  for (int32_t p : pos)
    for (int b = 0; b < 4; ++b) {
      h ^= (static_cast<uint32_t>(p) >> (8 * b)) & 0xFF;
      h *= 1099511628211ull;
    }
  return std::to_string(h);
}

// LongBench's 16 English and code datasets in the papers' column order (PyramidKV, MixedDimKV, VECTOR).
inline const std::vector<std::string>& longbench_english() {
  static const std::vector<std::string> d = {"narrativeqa",
                                             "qasper",
                                             "multifieldqa_en",
                                             "hotpotqa",
                                             "2wikimqa",
                                             "musique",
                                             "gov_report",
                                             "qmsum",
                                             "multi_news",
                                             "trec",
                                             "triviaqa",
                                             "samsum",
                                             "passage_count",
                                             "passage_retrieval_en",
                                             "lcc",
                                             "repobench-p"};
  return d;
}

// A fresh directory under the system's temporary one, removed with everything in it when the guard
// goes out of scope, also when a REQUIRE throws. ctest runs test cases in parallel processes and two
// test runs may share a machine, so a test writes nowhere else and leaves nothing behind.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    // mkdtemp creates the directory under a name no other process holds, atomically.
    std::string tmpl = (std::filesystem::temp_directory_path() / ("kvb_" + name + "_XXXXXX")).string();
    if (!::mkdtemp(tmpl.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;  // destructors must not throw; what a failed removal leaves collides with nothing
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& rel) const { return path_ / rel; }

 private:
  std::filesystem::path path_;
};

// A small random-weight Llama-family model (harness/model/random_model.hpp) written into `dir`: GQA
// with 2 query heads per KV head, head size 32, fp32 weights; its path. The weights depend on the shape
// and the seed, not on the declared context length.
inline std::string tiny_random_model(const TempDir& dir, const std::string& arch = "llama", int layers = 3,
                                     uint64_t seed = 7, int context = 2048) {
  ModelShape shape;
  shape.name = "tiny-" + arch;
  shape.arch = arch;
  shape.layers = layers;
  shape.hidden = 128;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.ffn = 256;
  shape.vocab = 300;
  shape.context = context;
  const std::string path = (dir / (shape.name + ".gguf")).string();
  write_random_model(path, shape, DType::F32, seed);
  return path;
}

// n normal samples of standard deviation sd from a seeded generator.
// Decode attention over `cache` on one thread (whole heads), then on each thread count of `counts`: the
// same numbers bit for bit however a layer's heads are cut over the threads. Returns the one-thread output.
inline std::vector<float> attend_across_threads(const LayerCache& cache, const std::vector<float>& q,
                                                std::initializer_list<int> counts) {
  std::vector<float> ref(q.size()), out(q.size());
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  attend(cache, q.data(), ref.data());
  for (int n : counts) {
    INFO(n << " threads");
    omp_set_num_threads(n);
    attend(cache, q.data(), out.data());
    CHECK(out == ref);
  }
  omp_set_num_threads(threads);
  return ref;
}

inline std::vector<float> randn(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Path of a file under models/ (or $KVBENCH_MODELS), or nullopt after a warning if it is absent; its
// absence fails the test when the environment variable `require` is 1 (the default model's files under
// KVBENCH_REQUIRE_MODELS, which scripts/test.sh sets; an optional model names its own).
inline std::optional<std::string> model_file(const std::string& rel, const char* require = "KVBENCH_REQUIRE_MODELS",
                                             const std::string& setup = "scripts/setup.sh") {
  const char* dir = std::getenv("KVBENCH_MODELS");
  const std::string path = (dir ? std::string(dir) : source_path("models")) + "/" + rel;
  if (std::filesystem::exists(path)) return path;
  const char* req = std::getenv(require);
  if (req && std::string(req) == "1") FAIL("missing " << path << " (run " << setup << ")");
  WARN("skipped: " << path << " is absent (run " << setup << ")");
  return std::nullopt;
}

// Whether default_data_dir()/rel, fetched by scripts/setup.sh, exists; otherwise a warning, or a
// failure under KVBENCH_REQUIRE_MODELS=1.
inline bool setup_data(const std::string& rel) {
  const std::string path = default_data_dir() + "/" + rel;
  if (std::filesystem::exists(path)) return true;
  const char* req = std::getenv("KVBENCH_REQUIRE_MODELS");
  if (req && std::string(req) == "1") FAIL("missing " << path << " (run scripts/setup.sh)");
  WARN("skipped: " << path << " is absent (run scripts/setup.sh)");
  return false;
}

inline const char* kDefaultModel = "SmolLM2-135M-Instruct.Q4_1.gguf";

// Runs f and checks it throws kvb::Error whose message contains every fragment.
template <typename F>
void require_error(F&& f, std::initializer_list<std::string> fragments) {
  try {
    f();
  } catch (const kvb::Error& e) {
    const std::string msg = e.what();
    INFO("message: " << msg);
    for (const auto& frag : fragments) CHECK(msg.find(frag) != std::string::npos);
    return;
  }
  FAIL("expected kvb::Error mentioning " << *fragments.begin());
}

// What f writes to standard error (a warning), read back from a file that stands in for fd 2 meanwhile.
template <typename F>
std::string captured_stderr(F&& f) {
  const TempDir dir("stderr");
  const std::string path = (dir / "err.txt").string();
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (saved < 0 || fd < 0) throw std::system_error(errno, std::generic_category(), "redirect stderr");
  ::dup2(fd, 2);
  ::close(fd);
  const auto restore = [&] {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
  };
  try {
    f();
  } catch (...) {
    restore();
    throw;
  }
  restore();
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const float d = std::abs(a[i] - b[i]);
    if (std::isnan(d)) return INFINITY;  // std::max would skip it: an unwritten or NaN output must fail
    m = std::max(m, d);
  }
  return m;
}

inline Buffer to_buffer(Backend& b, const std::vector<float>& v) {
  Buffer buf(b, v.size());
  b.upload(buf, v);
  return buf;
}

inline std::vector<float> from_buffer(Backend& b, const Buffer& buf) {
  std::vector<float> v(buf.size());
  b.download(buf, v);
  return v;
}

}  // namespace kvb::test
