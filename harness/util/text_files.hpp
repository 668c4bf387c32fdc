#pragma once
// Text inputs given on the command line: comma-separated files and directories (a directory stands for
// its *.txt files in name order), read whole, one string per file.
#include <string>
#include <vector>

namespace kvb {

// `what` names the option in errors (e.g. "haystack", "text").
std::vector<std::string> read_text_files(const std::string& spec, const std::string& what);

}  // namespace kvb
