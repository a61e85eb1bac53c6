# rein::redis: the hiredis-backed limiters of include/rein/redis/, built only when hiredis is found.
# Included by the top-level CMakeLists.txt (after rein::rein and rein::standalone exist).
#
# hiredis is looked for with pkg-config (hiredis.pc) and, failing that, by its header and library, so it is
# found whether or not pkg-config is installed. Defines, when found:
#   rein_redis       INTERFACE target, alias rein::redis (EXPORT_NAME redis): rein::rein (or, without Boost,
#                    rein::standalone) plus hiredis; installed as find_package(rein COMPONENTS redis)
#   rein_hiredis     build tree only: hiredis's include directory and library
#   REIN_HIREDIS_VERSION   e.g. 0.14.1
# Its tests (tests/redis), example (examples/redis) and benchmark (benchmarks/redis) are added by the
# top-level and tests/ CMakeLists.txt when the target exists.

option(REIN_WITH_REDIS "Build rein::redis (the Redis-backed limiters) when hiredis is found" ON)
if(NOT REIN_WITH_REDIS)
  return()
endif()

find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(REIN_PC_HIREDIS QUIET hiredis)
endif()
# pkg-config's include directory is .../include/hiredis; rein includes <hiredis/hiredis.h>, so find its parent.
find_path(REIN_HIREDIS_INCLUDE_DIR hiredis/hiredis.h
  HINTS ${REIN_PC_HIREDIS_INCLUDEDIR}
  DOC "Directory holding hiredis/hiredis.h")
find_library(REIN_HIREDIS_LIBRARY NAMES hiredis
  HINTS ${REIN_PC_HIREDIS_LIBDIR} ${REIN_PC_HIREDIS_LIBRARY_DIRS}
  DOC "The hiredis library")
if(NOT REIN_HIREDIS_INCLUDE_DIR OR NOT REIN_HIREDIS_LIBRARY)
  message(STATUS "rein: hiredis not found (Debian: libhiredis-dev): rein::redis is not built")
  return()
endif()

file(STRINGS "${REIN_HIREDIS_INCLUDE_DIR}/hiredis/hiredis.h" _rein_hiredis_version_lines
     REGEX "^#define HIREDIS_(MAJOR|MINOR|PATCH) [0-9]+")
set(REIN_HIREDIS_VERSION "")
foreach(_rein_part MAJOR MINOR PATCH)
  string(REGEX MATCH "HIREDIS_${_rein_part} ([0-9]+)" _rein_match "${_rein_hiredis_version_lines}")
  list(APPEND REIN_HIREDIS_VERSION "${CMAKE_MATCH_1}")
endforeach()
list(JOIN REIN_HIREDIS_VERSION "." REIN_HIREDIS_VERSION)
message(STATUS "rein: hiredis ${REIN_HIREDIS_VERSION} (${REIN_HIREDIS_LIBRARY}): rein::redis is built")

add_library(rein_hiredis INTERFACE)
# A compiler's own include directory must not be repeated as -isystem: that breaks #include_next.
if(NOT REIN_HIREDIS_INCLUDE_DIR IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
  target_include_directories(rein_hiredis SYSTEM INTERFACE "${REIN_HIREDIS_INCLUDE_DIR}")
endif()
target_link_libraries(rein_hiredis INTERFACE "${REIN_HIREDIS_LIBRARY}")

if(TARGET rein)
  set(REIN_REDIS_FLAVOUR rein)
  set(_rein_redis_flavour_target rein)
else()
  set(REIN_REDIS_FLAVOUR standalone)
  set(_rein_redis_flavour_target rein_standalone)
endif()

_rein_interface_target(rein_redis redis)
target_link_libraries(rein_redis INTERFACE
  ${_rein_redis_flavour_target}
  $<BUILD_INTERFACE:rein_hiredis>
  $<INSTALL_INTERFACE:rein::hiredis>)

rein_install_component(rein_redis redis
  DEPENDENCIES "${PROJECT_SOURCE_DIR}/cmake/package/redis-dependencies.cmake.in")

unset(_rein_hiredis_version_lines)
unset(_rein_part)
unset(_rein_match)
unset(_rein_redis_flavour_target)
