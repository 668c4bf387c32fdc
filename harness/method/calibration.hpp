#pragma once
// What a method's offline step (`kvbench calibrate METHOD MODEL`) gets: the model loaded with its
// tokenizer and an engine, the options the method declared (validated), where to write the artifact
// and where set-up put the benchmark data (default texts).
#include <cstdint>
#include <string>
#include <vector>

#include "harness/util/params.hpp"

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
  // How messages and progress name the step when one method's step runs another's (`kvbench calibrate
  // palu` runs dynakv-pca's); empty: the step's own name.
  std::string command = {};
};

// Token sequences of `len` tokens (BOS + text, as the papers' calibration rows) cut from the documents
// joined by blank lines, until `tokens` are reached; a shorter last one is kept if it has 2 or more.
// Text that gives fewer tokens is a warning on stderr naming `asked` (the command and the option that
// set `tokens`), and the step goes on with what there is (its header records the real counts).
std::vector<std::vector<int32_t>> token_sequences(const Tokenizer& tok, const std::vector<std::string>& docs, int len,
                                                  size_t tokens, const std::string& asked);

// Token sequences given as ids: a JSON file holding an array of sequences, or an object whose
// "sequences" field is one, each an array of at least 2 ids in [0, vocab) (e.g. the calibration windows
// of a paper's own code, so that both fit on the same tokens). Errors name the file, the sequence and
// the position.
std::vector<std::vector<int32_t>> read_id_sequences(const std::string& path, int vocab);
// The option that names such a file (`ids`), for steps that take either text or ids.
ParamSpec id_sequences_option();

// Documents split for fitting and validation: every `every`-th is held out, so that held-out text never
// shares a document with fitted text. Error naming `command` (and `hint`, how to change the split) when
// either side would be empty.
struct SplitDocuments {
  std::vector<std::string> fit, held;
};
SplitDocuments split_held_out(const std::vector<std::string>& docs, long every, const std::string& command,
                              const std::string& hint);

// The text an offline step fits on: the files or directories of `text`, or, when it is empty, set-up's
// Python documentation (<data_dir>/python-docs), every tenth document held out. `described` says which
// text it was for the artifact's header, with `paper_note` (what the paper used) after the default.
struct CalibrationText {
  SplitDocuments split;
  std::string described;
};
CalibrationText calibration_text(const std::string& text, const std::string& data_dir, const std::string& command,
                                 const std::string& paper_note);
// The options that choose it: `text` (files or directories) and `seq_len` (tokens per sequence).
std::vector<ParamSpec> calibration_text_options();

// The sequences a step that takes either text or ids fits on: the `ids` option's file when given
// (none longer than the model's context), else token_sequences of calibration_text with the `seq_len`
// and `tokens` options. `described` names them for the artifact's header; `seq_len` is the longest.
struct FitSequences {
  std::vector<std::vector<int32_t>> seqs;
  std::string described;
  long seq_len = 0;
};
FitSequences fit_sequences(const CalibrationContext& ctx, const std::string& command, const std::string& paper_note);

// The option `group_size`: KV heads per group of a grouped low-rank fit (Palu's G-LRD), 0 for all the
// layer's KV heads jointly; and its value for a model, checked to divide the KV heads.
ParamSpec group_size_option();
int heads_per_group(const Params& options, int n_kv_heads, const std::string& command);

}  // namespace kvb
