#include "harness/experiment/results.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/util/error.hpp"

namespace kvb {

void for_each_record(const std::string& path, const std::function<void(const nlohmann::json&, int)>& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
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
      if (last) return;  // torn by a kill mid-write
      fail("{}:{}: not a JSON record ({}); remove the line", path, no, e.what());
    }
    if (last) return;  // no newline yet: the write did not finish
    fn(j, no);
  }
}

ResultsFile::ResultsFile(const std::string& path) : path_(path) {
  namespace fs = std::filesystem;
  if (auto dir = fs::path(path).parent_path(); !dir.empty()) fs::create_directories(dir);
  if (fs::exists(path)) {
    // Keep everything up to the last newline: a record without one was cut off.
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
    if (keep != text.size()) fs::resize_file(path, keep);
  }
  f_ = std::fopen(path.c_str(), "ab");
  if (!f_) fail("{}: cannot open for appending", path);
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
