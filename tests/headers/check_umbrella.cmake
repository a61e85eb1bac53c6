# CTest tests umbrella_header and testing_header: an umbrella header includes exactly the public headers
# it stands for, read from include/ at test time (no reconfigure needed to notice a new header).
#   cmake -DINCLUDE_DIR=<include> -DUMBRELLA=<rein.hpp|rein/testing.hpp> -P check_umbrella.cmake
#
#   rein.hpp           every header under include/rein/ except detail/ (not API), impl/ (the separately
#                      compiled part, one unit only), prometheus/ and redis/ (need prometheus-cpp and hiredis,
#                      target rein::redis), testing/ (the test kit) and rein/testing.hpp
#   rein/testing.hpp   every header under include/rein/testing/
if(UMBRELLA STREQUAL "rein.hpp")
  file(GLOB_RECURSE paths RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/rein/*.hpp")
  list(FILTER paths EXCLUDE REGEX "^rein/(detail|impl|prometheus|redis|testing)/")
  list(REMOVE_ITEM paths rein/testing.hpp)
elseif(UMBRELLA STREQUAL "rein/testing.hpp")
  file(GLOB_RECURSE paths RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/rein/testing/*.hpp")
else()
  message(FATAL_ERROR "check_umbrella.cmake: unknown UMBRELLA '${UMBRELLA}'")
endif()
list(SORT paths)

file(STRINGS "${INCLUDE_DIR}/${UMBRELLA}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*<rein/")
set(listed "")
foreach(line IN LISTS lines)
  string(REGEX MATCH "<(rein/[^>]+)>" match "${line}")
  list(APPEND listed "${CMAKE_MATCH_1}")
endforeach()

set(missing ${paths})
if(listed)
  list(REMOVE_ITEM missing ${listed})
endif()
set(extra ${listed})
if(paths)
  list(REMOVE_ITEM extra ${paths})
endif()
if(missing OR extra)
  list(JOIN missing ", " missing)
  list(JOIN extra ", " extra)
  message(FATAL_ERROR "include/${UMBRELLA} does not match include/rein/:\n"
                      "  not included: ${missing}\n  included but not expected: ${extra}")
endif()
list(LENGTH paths count)
message(STATUS "include/${UMBRELLA} includes the ${count} headers it stands for")
