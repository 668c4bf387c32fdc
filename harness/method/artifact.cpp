#include "harness/method/artifact.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "harness/util/base64.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"

namespace kvb {

namespace fs = std::filesystem;

std::string artifacts_dir() {
  const char* env = std::getenv("KVBENCH_ARTIFACTS");
  return env && *env ? std::string(env) : std::string("artifacts");
}

std::string default_artifact_path(const std::string& kind, const ModelConfig& model) {
  if (model.fingerprint.empty())
    fail("{} artifact: the model has no fingerprint (not loaded from a file); give the artifact's path", kind);
  return (fs::path(artifacts_dir()) / kind / (model.fingerprint + ".json")).string();
}

nlohmann::json artifact_header(const std::string& kind, const ModelConfig& model, const std::string& model_path) {
  return {{"kind", kind},
          {"model",
           {{"file", fs::path(model_path).filename().string()},
            {"fingerprint", model.fingerprint},
            {"name", model.name},
            {"layers", model.n_layers},
            {"heads", model.n_heads},
            {"kv_heads", model.n_kv_heads},
            {"head_dim", model.head_dim}}}};
}

namespace {
thread_local ArtifactReads* current_reads = nullptr;
}  // namespace

ArtifactReads::ArtifactReads() : outer_(current_reads) { current_reads = this; }
ArtifactReads::~ArtifactReads() { current_reads = outer_; }

LoadedArtifact load_artifact(const std::string& kind, const std::string& path, const ModelConfig& model,
                             const std::string& make_command) {
  LoadedArtifact a;
  a.path = path.empty() ? default_artifact_path(kind, model) : path;
  if (!fs::exists(a.path)) {
    if (path.empty())
      fail("no {} artifact for this model (fingerprint {}) at {}; make it with `{}`", kind, model.fingerprint, a.path,
           make_command);
    fail("{}: no such {} artifact; make one with `{}`", a.path, kind, make_command);
  }
  if (current_reads) current_reads->paths_.push_back(a.path);
  std::ifstream in(a.path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  a.digest = fmt::format("{:016x}", fnv1a(text));
  try {
    a.body = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // Python's json.dump writes NaN and Infinity, which JSON has no words for.
    for (const char* word : {"NaN", "Infinity"})
      if (text.find(word) != std::string::npos)
        fail("{}: holds {} (not valid JSON), expected finite numbers; was the profiling run broken?", a.path, word);
    fail("{}: not valid JSON ({})", a.path, e.what());
  }
  if (!a.body.is_object()) fail("{}: expected a JSON object", a.path);
  if (a.body.contains("header")) {
    const auto& h = a.body["header"];
    a.has_header = true;
    if (!h.is_object() || !h.contains("kind") || !h.contains("model") || !h["model"].is_object() ||
        !h["model"].contains("fingerprint") || !h["model"]["fingerprint"].is_string())
      fail("{}: field 'header' must hold 'kind' and 'model.fingerprint' (a string)", a.path);
    if (h["kind"] != kind) fail("{}: a {} artifact, expected {}", a.path, h["kind"].dump(), kind);
    const std::string fp = h["model"]["fingerprint"].get<std::string>();
    if (!model.fingerprint.empty() && fp != model.fingerprint)
      fail("{}: made for model {} (fingerprint {}), not this one (fingerprint {}); make this model's with `{}`", a.path,
           h["model"].contains("file") ? h["model"]["file"].dump() : std::string("?"), fp, model.fingerprint,
           make_command);
  }
  return a;
}

void check_artifact_destination(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec))
    fail("{}: is a directory; an artifact's path names a file (e.g. {}/NAME.json)", path, path);
  for (fs::path dir = p.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir, ec)) {
      if (!fs::is_directory(dir, ec))
        fail("{}: cannot write the artifact: {} is a file, not a directory", path, dir.string());
      break;
    }
    if (dir == dir.parent_path()) break;
  }
}

void write_artifact(const std::string& path, const nlohmann::json& body) {
  check_artifact_destination(path);
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path() && (fs::create_directories(p.parent_path(), ec), ec))
    fail("{}: cannot create its directory: {}", path, ec.message());
  const std::string tmp = path + ".part";
  {
    std::ofstream out(tmp);
    if (!out) fail("{}: cannot write", tmp);
    out << body.dump() << "\n";
    if (!out.flush()) fail("{}: write failed", tmp);
  }
  if (fs::rename(tmp, path, ec), ec) fail("{}: cannot move {} into place: {}", path, tmp, ec.message());
}

std::vector<float> artifact_floats(const nlohmann::json& j, const char* key, size_t n, const std::string& where) {
  if (!j.contains(key)) fail("{}: field '{}' missing (expected base64 float32)", where, key);
  if (!j[key].is_string())
    fail("{}: field '{}' is {}, expected a base64 string of float32", where, key, j[key].type_name());
  auto x = floats_from_base64(j[key].get<std::string>(), where + "." + key);
  if (x.size() != n) fail("{}.{}: {} numbers, expected {}", where, key, x.size(), n);
  for (float v : x)
    if (!std::isfinite(v)) fail("{}.{}: holds a non-finite number", where, key);
  return x;
}

}  // namespace kvb
