# CTest test version_header: include/rein/version.hpp states the version of project(rein VERSION ...).
#   cmake -DHEADER=<include/rein/version.hpp> -DEXPECTED=<PROJECT_VERSION> -P check_version.cmake
file(STRINGS "${HEADER}" lines REGEX "^#define REIN_VERSION")
set(found "")
foreach(part MAJOR MINOR PATCH)
  string(REGEX MATCH "#define REIN_VERSION_${part} ([0-9]+)" match "${lines}")
  if(NOT match)
    message(FATAL_ERROR "${HEADER}: no REIN_VERSION_${part}")
  endif()
  list(APPEND found "${CMAKE_MATCH_1}")
endforeach()
list(JOIN found "." numbers)
string(REGEX MATCH "#define REIN_VERSION \"([^\"]*)\"" match "${lines}")
set(text "${CMAKE_MATCH_1}")
if(NOT numbers STREQUAL EXPECTED OR NOT text STREQUAL EXPECTED)
  message(FATAL_ERROR "${HEADER} says ${numbers} (REIN_VERSION \"${text}\"), "
                      "project(rein VERSION) says ${EXPECTED}: update one of them")
endif()
message(STATUS "rein/version.hpp: ${text}")
