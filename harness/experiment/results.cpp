#include "harness/experiment/results.hpp"

#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include "harness/util/error.hpp"

namespace kvb {

namespace {

using json = nlohmann::json;

struct Kind {
  const char* what;
  bool (*ok)(const json&);
};
const Kind kString{"a string", [](const json& v) { return v.is_string(); }};
const Kind kNumber{"a number", [](const json& v) { return v.is_number(); }};
const Kind kInteger{"an integer", [](const json& v) { return v.is_number_integer(); }};
const Kind kBool{"true or false", [](const json& v) { return v.is_boolean(); }};
const Kind kObject{"an object", [](const json& v) { return v.is_object(); }};
const Kind kObjectOrNull{"an object or null", [](const json& v) { return v.is_object() || v.is_null(); }};
const Kind kList{"a list", [](const json& v) { return v.is_array(); }};
const Kind kTextMap{"an object of text values", [](const json& v) {
                      if (!v.is_object()) return false;
                      for (const auto& [k, x] : v.items())
                        if (!x.is_string()) return false;
                      return true;
                    }};

struct Field {
  const char* name;
  const Kind& kind;
  bool required = false;
};

// The fields docs/results-format.md gives a type for, by object (prefix as errors name it).
const std::vector<std::pair<const char*, std::vector<Field>>>& record_fields() {
  static const std::vector<std::pair<const char*, std::vector<Field>>> fields = {
      {"",
       {{"config", kObject, true},
        {"score", kNumber, true},
        {"key", kString},
        {"version", kString},
        {"id", kString},
        {"prediction", kString},
        {"kv_dtype", kString},
        {"weights", kString},
        {"prompt_tokens", kNumber},
        {"kv_bytes", kNumber},
        {"full_kv_bytes", kNumber},
        {"peak_memory_bytes", kNumber},
        {"T_eq", kNumber},
        {"kv_bits_per_element", kNumber},
        {"prefill_seconds", kNumber},
        {"decode_seconds", kNumber},
        {"compress_seconds", kNumber},
        {"wall_seconds", kNumber},
        {"prefill_shared", kBool},
        {"scored_from", kString},
        {"prompt_digest", kString},
        {"answers", kList},
        {"protocol", kObject},
        {"cache", kObjectOrNull},
        {"meta", kObject}}},
      {"config.",
       {{"task", kString},
        {"method", kString},
        {"model", kString},
        {"model_fingerprint", kString},
        {"gqa", kString},
        {"kv_dtype", kString},
        {"weights", kString},
        {"version", kString},
        {"options", kTextMap},
        {"params", kTextMap},
        {"budget", kInteger},
        {"compression_ratio", kNumber},
        {"artifacts", kObject}}},
      {"meta.", {{"depth", kInteger}, {"length", kInteger}}}};
  return fields;
}

}  // namespace

void check_record(const json& r, const std::string& where) {
  if (!r.is_object()) fail("{}: not a kvbench result record (a JSON object expected)", where);
  for (const auto& [prefix, fields] : record_fields()) {
    // Checked in order, so a nested object is known to be one when its fields are checked.
    const std::string_view p = prefix;
    const json* parent = &r;
    if (!p.empty()) {
      const auto it = r.find(std::string(p.substr(0, p.size() - 1)));
      if (it == r.end()) continue;
      parent = &*it;
    }
    for (const Field& f : fields) {
      const auto it = parent->find(f.name);
      if (it == parent->end()) {
        if (f.required) fail("{}: not a kvbench result record: field '{}{}' is missing", where, prefix, f.name);
      } else if (!f.kind.ok(*it)) {
        fail("{}: field '{}{}' must be {}", where, prefix, f.name, f.kind.what);
      }
    }
  }
}

namespace {

bool is_gzip(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[2] = {};
  return in.read(magic, 2) && static_cast<unsigned char>(magic[0]) == 0x1f &&
         static_cast<unsigned char>(magic[1]) == 0x8b;
}

// The whole text of a results file, gzip-compressed or not ("" for a missing file).
std::string results_text(const std::string& path, bool gzip) {
  if (!gzip) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  gzFile gz = gzopen(path.c_str(), "rb");
  if (!gz) fail("{}: cannot open", path);
  std::string text;
  std::vector<char> buf(1 << 20);
  int n = 0;
  while ((n = gzread(gz, buf.data(), static_cast<unsigned>(buf.size()))) > 0) text.append(buf.data(), size_t(n));
  int err = Z_OK;
  std::string why = gzerror(gz, &err);
  if (why.starts_with(path + ": ")) why.erase(0, path.size() + 2);  // zlib names the file too
  // gzclose says Z_BUF_ERROR where the data ended inside the compressed stream (a cut-off file).
  if (gzclose(gz) != Z_OK || n < 0 || (err != Z_OK && err != Z_STREAM_END))
    fail("{}: not a whole gzip file ({}); compress the .jsonl again", path, why.empty() ? "cut off" : why);
  return text;
}

}  // namespace

bool is_results_file_name(const std::string& name) { return name.ends_with(".jsonl") || name.ends_with(".jsonl.gz"); }

void for_each_record(const std::string& path, const std::function<void(const nlohmann::json&, int)>& fn, bool live) {
  // A file named .gz that is empty was not compressed from records at all.
  const bool gzip = is_gzip(path);
  if (!gzip && path.ends_with(".gz") && std::filesystem::exists(path) && std::filesystem::file_size(path) == 0)
    fail("{}: an empty file, not a gzip-compressed results file", path);
  const std::string text = results_text(path, gzip);
  int no = 0;
  for (size_t start = 0; start < text.size();) {
    const size_t end = text.find('\n', start);
    const bool last = end == std::string::npos;
    const std::string line = text.substr(start, last ? std::string::npos : end - start);
    ++no;
    start = last ? text.size() : end + 1;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      // A record is written with its newline at once: a last line without one that does not parse was
      // torn by a kill mid-write (a resumed run cuts it; a file compressed after the kill keeps it). One
      // that parses is whole (a file saved by another tool without the final newline) and counts.
      if (last) {
        if (!live)
          fmt::print(stderr, "{}:{}: the last line is not a whole record (a run killed mid-write?); left out\n", path,
                     no);
        return;
      }
      fail("{}:{}: not a JSON record ({}); remove the line", path, no, e.what());
    }
    check_record(j, fmt::format("{}:{}", path, no));
    fn(j, no);
  }
}

ResultsFile::ResultsFile(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  if (path.ends_with(".gz") || is_gzip(path))
    fail(
        "{}: a gzip-compressed results file cannot be appended to; write to a .jsonl (to resume committed "
        "records, decompress them there first: gunzip -c {} > runs/NAME.jsonl)",
        path, path);
  if (fs::is_directory(path))
    fail("{}: a directory; a results file is a .jsonl file (e.g. {}/results.jsonl)", path,
         fs::path(path).lexically_normal().string());
  if (auto dir = fs::path(path).parent_path(); !dir.empty()) fs::create_directories(dir);
  f_ = std::fopen(path.c_str(), "ab");
  if (!f_) fail("{}: cannot open for appending", path);
  // One writer per file: a second run of the same shard (a task resubmitted while the first still
  // runs) would interleave records and cut the other's line in flight below.
  if (flock(fileno(f_), LOCK_EX | LOCK_NB) != 0) {
    std::fclose(f_);
    f_ = nullptr;
    fail(
        "{}: another kvbench process is writing this results file (the same sweep or shard running twice?); "
        "wait for it to finish or write to another file",
        path);
  }
  // After the last newline: a whole record (saved without its newline by another tool, and read as one)
  // gets its newline; anything else was cut off by a kill mid-write and goes.
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (keep == text.size()) return;
  if (nlohmann::json::accept(text.substr(keep))) {
    if (std::fputc('\n', f_) == EOF || std::fflush(f_) != 0) fail("{}: write failed (disk full?)", path_);
  } else {
    fs::resize_file(path, keep);
  }
}

ResultsFile::~ResultsFile() {
  if (f_) std::fclose(f_);
}

void ResultsFile::append(const nlohmann::json& record) {
  const std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0 || fsync(fileno(f_)) != 0)
    fail("{}: write failed (disk full?)", path_);
}

}  // namespace kvb
