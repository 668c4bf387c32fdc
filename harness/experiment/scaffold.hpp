#pragma once
// `kvbench new method NAME` and `kvbench new task NAME`: a new component's file and test, from the
// worked example of docs/adding-a-method.md or docs/adding-a-task.md (compiled and tested as part of
// the build) under the new name.
#include <string>

namespace kvb {

enum class ScaffoldKind { Method, Task };

struct ScaffoldFiles {
  std::string source, test;  // the paths written
};

// The example's text with its name and class name replaced by `name` and its CamelCase.
std::string scaffold_rename(ScaffoldKind kind, const std::string& text, const std::string& name);
// Writes ROOT/methods/NAME/NAME.cpp and ROOT/methods/NAME/test_NAME.cpp (a task: ROOT/tasks/NAME/NAME.cpp
// and ROOT/tests/test_NAME.cpp).
// Errors (nothing written) for a name that is not lower case letters, digits and underscores, one
// already registered or the example's own, a ROOT that is not a kvbench source tree, or a file that
// exists.
ScaffoldFiles scaffold(ScaffoldKind kind, const std::string& name, const std::string& root);

}  // namespace kvb
