#pragma once
// Results files: one JSON record per line, appended and synced one at a time so that a killed run
// loses at most the record being written; a torn last line is dropped (and cut from the file) when
// the file is opened again.
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace kvb {

// Calls fn(record, line_number) for each record of a results file (a missing file has none). A
// malformed line is an error naming the file and line, except a torn last line, which is skipped.
void for_each_record(const std::string& path, const std::function<void(const nlohmann::json&, int)>& fn);

class ResultsFile {
 public:
  // Opens for appending (creating directories), first cutting a torn last line.
  explicit ResultsFile(const std::string& path);
  ~ResultsFile();
  ResultsFile(const ResultsFile&) = delete;
  ResultsFile& operator=(const ResultsFile&) = delete;

  const std::string& path() const { return path_; }
  void append(const nlohmann::json& record);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace kvb
