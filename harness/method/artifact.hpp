#pragma once
// Offline artifacts of methods (head-importance scores, regression maps, profiles): JSON files written
// by `kvbench calibrate METHOD MODEL`, keyed by the model's fingerprint so that a method never runs
// with another model's calibration. The default location is artifacts/<kind>/<fingerprint>.json under
// $KVBENCH_ARTIFACTS or the working directory; a method parameter may name a file instead.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/model/config.hpp"

namespace kvb {

// $KVBENCH_ARTIFACTS, or ./artifacts.
std::string artifacts_dir();
// Where `kvbench calibrate` writes the artifact of `kind` for this model by default.
std::string default_artifact_path(const std::string& kind, const ModelConfig& model);

// The header every artifact carries: what it is, which model (fingerprint and shapes) it belongs to.
nlohmann::json artifact_header(const std::string& kind, const ModelConfig& model, const std::string& model_path);

struct LoadedArtifact {
  std::string path;
  nlohmann::json body;
  bool has_header = false;  // false for a foreign file in a reference layout (checked by shape only)
  std::string digest;       // fnv1a-64 of the file's text, as 16 hex digits
};

// Reads the artifact at `path`, or at the default location when `path` is empty. A missing file says
// which command makes it (`make_command`); a file with a header for another model, or of another
// kind, is an error naming both fingerprints. Files without our header are accepted as they are.
LoadedArtifact load_artifact(const std::string& kind, const std::string& path, const ModelConfig& model,
                             const std::string& make_command);

// While one lives on a thread, the paths load_artifact reads on that thread are kept (in order), so
// that an error found later in a file's fields can name the files it may be in.
class ArtifactReads {
 public:
  ArtifactReads();
  ~ArtifactReads();
  ArtifactReads(const ArtifactReads&) = delete;
  ArtifactReads& operator=(const ArtifactReads&) = delete;
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  friend LoadedArtifact load_artifact(const std::string&, const std::string&, const ModelConfig&, const std::string&);
  std::vector<std::string> paths_;
  ArtifactReads* outer_;
};

// The base64 float32 array at j[key] of exactly n finite numbers; errors name `where` and the field.
std::vector<float> artifact_floats(const nlohmann::json& j, const char* key, size_t n, const std::string& where);

// An error unless `path` can become an artifact file: not a directory, under no file. Offline steps
// check it before their work, so a bad --out does not throw the work away.
void check_artifact_destination(const std::string& path);
// Writes atomically (temporary file, then rename), creating directories.
void write_artifact(const std::string& path, const nlohmann::json& body);

}  // namespace kvb
