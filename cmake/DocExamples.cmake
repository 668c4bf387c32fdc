# The worked example of docs/adding-a-method.md is code: the build extracts its two blocks, compiles
# them into the tests and embeds them as the template of `kvbench new method`, so the page cannot
# drift from code that builds and passes.
set(KVBENCH_METHOD_DOC ${CMAKE_SOURCE_DIR}/docs/adding-a-method.md)
set(KVBENCH_GENERATED ${CMAKE_BINARY_DIR}/generated)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${KVBENCH_METHOD_DOC})
file(READ ${KVBENCH_METHOD_DOC} kvbench_method_doc)

# The body of the ```cpp block whose first line is "// PATH" (that line included).
function(kvbench_doc_block path out_var)
  set(open "```cpp\n// ${path}\n")
  string(FIND "${kvbench_method_doc}" "${open}" start)
  if(start EQUAL -1)
    message(FATAL_ERROR "${KVBENCH_METHOD_DOC}: no ```cpp block whose first line is // ${path}")
  endif()
  math(EXPR start "${start} + 7")  # past the fence line
  string(SUBSTRING "${kvbench_method_doc}" ${start} -1 rest)
  string(FIND "${rest}" "\n```" end)
  string(SUBSTRING "${rest}" 0 ${end} block)
  set(${out_var} "${block}\n" PARENT_SCOPE)
endfunction()

# Writes only when the content changed, so a reconfigure does not rebuild what it does not touch.
function(kvbench_write_if_changed path content)
  file(WRITE ${path}.tmp "${content}")
  configure_file(${path}.tmp ${path} COPYONLY)
  file(REMOVE ${path}.tmp)
endfunction()

kvbench_doc_block(methods/keynorm.cpp kvbench_example_method)
kvbench_doc_block(tests/test_keynorm.cpp kvbench_example_test)
kvbench_write_if_changed(${KVBENCH_GENERATED}/doc_examples/keynorm.cpp "${kvbench_example_method}")
kvbench_write_if_changed(${KVBENCH_GENERATED}/doc_examples/test_keynorm.cpp "${kvbench_example_test}")
set(KVBENCH_DOC_EXAMPLE_SOURCES ${KVBENCH_GENERATED}/doc_examples/keynorm.cpp
                                ${KVBENCH_GENERATED}/doc_examples/test_keynorm.cpp)
kvbench_write_if_changed(${KVBENCH_GENERATED}/kvbench/method_template.hpp
"#pragma once
// Generated from docs/adding-a-method.md by cmake/DocExamples.cmake: the template of kvbench new method.
namespace kvb::generated {
inline constexpr const char* kMethodTemplate = R\"kvbdoc(${kvbench_example_method})kvbdoc\";
inline constexpr const char* kMethodTestTemplate = R\"kvbdoc(${kvbench_example_test})kvbdoc\";
}  // namespace kvb::generated
")
