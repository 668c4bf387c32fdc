#include "harness/util/text_files.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/util/error.hpp"

namespace kvb {

std::vector<std::string> read_text_files(const std::string& spec, const std::string& what) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::stringstream ss(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    if (fs::is_directory(item)) {
      std::vector<fs::path> in_dir;
      for (const auto& e : fs::directory_iterator(item))
        if (e.is_regular_file() && e.path().extension() == ".txt") in_dir.push_back(e.path());
      std::sort(in_dir.begin(), in_dir.end());
      if (in_dir.empty()) fail("{} directory {} holds no .txt files", what, item);
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else if (fs::is_regular_file(item)) {
      files.push_back(item);
    } else {
      fail("{} '{}': no such file or directory", what, item);
    }
  }
  if (files.empty()) fail("{}: no files given", what);
  std::vector<std::string> out;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) fail("{} file {} cannot be read", what, f.string());
    std::stringstream buf;
    buf << in.rdbuf();
    out.push_back(buf.str());
  }
  return out;
}

}  // namespace kvb
