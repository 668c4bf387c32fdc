#pragma once
// Results files: one JSON record per line, appended and synced one at a time so that a killed run
// loses at most the record being written; a torn last line is dropped (and cut from the file) when
// the file is opened again.
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace kvb {

// Calls fn(record, line_number) for each record of a results file, plain or gzip-compressed (committed
// results are kept compressed), a missing file having none. A
// malformed line is an error naming the file and line, except a torn last line, which is skipped; so
// is a record whose fields do not have the types docs/results-format.md gives (check_record).
// `live`: the file may be being written (a running shard), so an unfinished last line is no news.
void for_each_record(const std::string& path, const std::function<void(const nlohmann::json&, int)>& fn,
                     bool live = false);

// Whether a file name is a results file's: NAME.jsonl, or NAME.jsonl.gz (committed records).
bool is_results_file_name(const std::string& name);

// Error naming `where`, the field and the type expected, unless the record is an object with a
// `config` object and a numeric `score`, and every other field the report reads has its documented
// type where present. Consumers can then read fields without type checks of their own.
void check_record(const nlohmann::json& record, const std::string& where);

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
