# The worked examples of docs/adding-a-method.md and docs/adding-a-task.md are code: the build
# extracts their blocks, compiles them into the tests and embeds them as the templates of `kvbench new
# method` and `kvbench new task`, so the pages cannot drift from code that builds and passes.
set(KVBENCH_GENERATED ${CMAKE_BINARY_DIR}/generated)
set(KVBENCH_DOC_EXAMPLE_SOURCES)
set(kvbench_doc_templates "")
set(kvbench_doc_example_names "")

# Writes only when the content changed, so a reconfigure does not rebuild what it does not touch.
function(kvbench_write_if_changed path content)
  file(WRITE ${path}.tmp "${content}")
  configure_file(${path}.tmp ${path} COPYONLY)
  file(REMOVE ${path}.tmp)
endfunction()

# The body of the ```cpp block of DOC whose first line is "// PATH" (that line included).
function(kvbench_doc_block doc path out_var)
  file(READ ${CMAKE_SOURCE_DIR}/${doc} text)
  set(open "```cpp\n// ${path}\n")
  string(FIND "${text}" "${open}" start)
  if(start EQUAL -1)
    message(FATAL_ERROR "${doc}: no ```cpp block whose first line is // ${path}")
  endif()
  math(EXPR start "${start} + 7")  # past the fence line
  string(SUBSTRING "${text}" ${start} -1 rest)
  string(FIND "${rest}" "\n```" end)
  string(SUBSTRING "${rest}" 0 ${end} block)
  set(${out_var} "${block}\n" PARENT_SCOPE)
endfunction()

# DOC's example SOURCE and its TEST, compiled into the tests and embedded as the C++ constants
# k<NAME>Template and k<NAME>TestTemplate.
macro(kvbench_doc_example doc source test name)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/${doc})
  kvbench_doc_block(${doc} ${source} kvbench_source_block)
  kvbench_doc_block(${doc} ${test} kvbench_test_block)
  get_filename_component(kvbench_source_file ${source} NAME)
  get_filename_component(kvbench_test_file ${test} NAME)
  get_filename_component(kvbench_example_name ${source} NAME_WE)
  string(APPEND kvbench_doc_example_names " ${kvbench_example_name}")
  kvbench_write_if_changed(${KVBENCH_GENERATED}/doc_examples/${kvbench_source_file} "${kvbench_source_block}")
  kvbench_write_if_changed(${KVBENCH_GENERATED}/doc_examples/${kvbench_test_file} "${kvbench_test_block}")
  list(APPEND KVBENCH_DOC_EXAMPLE_SOURCES ${KVBENCH_GENERATED}/doc_examples/${kvbench_source_file}
       ${KVBENCH_GENERATED}/doc_examples/${kvbench_test_file})
  string(APPEND kvbench_doc_templates
         "inline constexpr const char* k${name}Template = R\"kvbdoc(${kvbench_source_block})kvbdoc\";\n"
         "inline constexpr const char* k${name}TestTemplate = R\"kvbdoc(${kvbench_test_block})kvbdoc\";\n")
endmacro()

kvbench_doc_example(docs/adding-a-method.md methods/keynorm/keynorm.cpp methods/keynorm/test_keynorm.cpp Method)
kvbench_doc_example(docs/adding-a-method.md methods/snapkv_int8/snapkv_int8.cpp methods/snapkv_int8/test_snapkv_int8.cpp
                    Int8Method)
kvbench_doc_example(docs/adding-a-task.md tasks/passkey/passkey.cpp tests/test_passkey.cpp Task)
kvbench_write_if_changed(${KVBENCH_GENERATED}/kvbench/doc_templates.hpp
"#pragma once
// Generated from docs/ by cmake/DocExamples.cmake: the templates of kvbench new method and new task.
namespace kvb::generated {
${kvbench_doc_templates}// The examples' names, each between spaces: the tests register them, so no new one may take them.
inline constexpr const char* kDocExampleNames = \"${kvbench_doc_example_names} \";
}  // namespace kvb::generated
")
