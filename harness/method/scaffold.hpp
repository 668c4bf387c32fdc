#pragma once
// `kvbench new method NAME`: a new method's file and test, from the worked example of
// docs/adding-a-method.md (compiled and tested as part of the build) under the new name.
#include <string>

namespace kvb {

struct ScaffoldFiles {
  std::string method, test;  // the paths written
};

// The example's text with its method name and class name replaced by `name` and its CamelCase.
std::string scaffold_rename(const std::string& text, const std::string& name);
// Writes ROOT/methods/NAME.cpp and ROOT/tests/test_NAME.cpp. Errors (nothing written) for a name that
// is not lower case letters, digits and underscores, one already registered, a ROOT without methods/
// and tests/, or a file that exists.
ScaffoldFiles scaffold_method(const std::string& name, const std::string& root);

}  // namespace kvb
