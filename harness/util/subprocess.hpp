#pragma once
// Running another program (the scheduler's commands) and capturing what it says: argv is passed as
// is, with no shell in between, so arguments need no quoting.
#include <string>
#include <vector>

namespace kvb {

struct ProcessResult {
  int exit_code = -1;  // the program's exit status; 128 + N if killed by signal N
  std::string out, err;
};

// The full path of `name` found on PATH (a name with a '/' is taken as given if executable); empty
// if there is none.
std::string find_program(const std::string& name);

// Runs argv[0] (looked up on PATH) to completion with `input` on its standard input. Error if it
// cannot be started at all.
ProcessResult run_process(const std::vector<std::string>& argv, const std::string& input = "");

}  // namespace kvb
