#pragma once
// What a method's offline step (`kvbench calibrate METHOD MODEL`) gets: the model loaded with its
// tokenizer and an engine, the options the method declared (validated), where to write the artifact
// and where set-up put the benchmark data (default texts).
#include <string>

#include "harness/method/params.hpp"

namespace kvb {

class ModelFile;
class Tokenizer;
class Engine;

class CalibrationContext {
 public:
  const ModelFile& model;
  const Tokenizer& tokenizer;
  Engine& engine;
  Params options;
  std::string out;       // artifact path; empty: the default location for the model
  std::string data_dir;  // set-up's data directory
  bool progress = true;
};

}  // namespace kvb
