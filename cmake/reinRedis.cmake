# rein::redis: the hiredis-backed limiters of include/rein/redis/, built only when hiredis is found.
# Included by the top-level CMakeLists.txt (after rein::rein and rein::standalone exist).
#
# hiredis is looked for with pkg-config (hiredis.pc) and, failing that, by its header and library, so it is
# found whether or not pkg-config is installed. Defines, when found:
#   rein_redis       INTERFACE target, alias rein::redis (EXPORT_NAME redis): rein::rein (or, without Boost,
#                    rein::standalone) plus hiredis; installed as find_package(rein COMPONENTS redis)
#   rein_hiredis     build tree only: hiredis's include directory and library
#   REIN_HIREDIS_VERSION   e.g. 0.14.1
#   rein_redis_tls   INTERFACE target, alias rein::redis_tls: rein::redis with TLS, when OpenSSL is found
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

# rein::redis_tls: rein::redis with TLS to the servers (REIN_REDIS_TLS; OpenSSL::SSL), only when OpenSSL is
# found (Debian: libssl-dev). Opt-in, so that rein::redis needs no OpenSSL: link it instead of rein::redis in
# every target of a program that uses TLS (the macro changes the connection's layout, so all files of one
# program must agree). Installed as find_package(rein COMPONENTS redis_tls).
option(REIN_WITH_REDIS_TLS "Build rein::redis_tls (TLS to Redis) when OpenSSL is found" ON)
if(REIN_WITH_REDIS_TLS)
  find_package(OpenSSL 1.1.1 QUIET COMPONENTS SSL)
  if(OpenSSL_FOUND AND TARGET OpenSSL::SSL)
    message(STATUS "rein: OpenSSL ${OPENSSL_VERSION}: rein::redis_tls is built")
    _rein_interface_target(rein_redis_tls redis_tls)
    target_link_libraries(rein_redis_tls INTERFACE rein_redis OpenSSL::SSL)
    target_compile_definitions(rein_redis_tls INTERFACE REIN_REDIS_TLS)
    rein_install_component(rein_redis_tls redis_tls
      DEPENDENCIES "${PROJECT_SOURCE_DIR}/cmake/package/redis_tls-dependencies.cmake.in")
  else()
    message(STATUS "rein: OpenSSL not found (Debian: libssl-dev): rein::redis_tls is not built")
  endif()
endif()

unset(_rein_hiredis_version_lines)
unset(_rein_part)
unset(_rein_match)
unset(_rein_redis_flavour_target)
