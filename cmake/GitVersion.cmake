# Run at every build (cmake -P), not at configure: the version a result records must name the code
# that produced it, and a configure-time stamp went stale with every commit built without rerunning
# cmake. The header is rewritten only when the version changes, so an unchanged tree rebuilds nothing.
#   cmake -DSOURCE_DIR=... -DOUT=.../git_version.hpp -DFALLBACK=<project version> -P GitVersion.cmake
execute_process(COMMAND git describe --always --dirty WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT version)
  set(version "${FALLBACK}")
endif()
set(content "#pragma once\n#define KVBENCH_GIT_VERSION \"${version}\"\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL content)
  file(WRITE ${OUT} "${content}")
endif()
