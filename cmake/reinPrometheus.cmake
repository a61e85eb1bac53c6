# rein::prometheus: rein's limiters as Prometheus metrics through prometheus-cpp (include/rein/prometheus/),
# built only when prometheus-cpp is found (Debian: prometheus-cpp-dev). Included by the top-level
# CMakeLists.txt after rein::rein and rein::standalone exist, like cmake/reinRedis.cmake. Defines, when found:
#   rein_prometheus  INTERFACE target, alias rein::prometheus (EXPORT_NAME prometheus): rein::rein (or,
#                    without Boost, rein::standalone) plus prometheus-cpp::core; installed as
#                    find_package(rein COMPONENTS prometheus)
# Its example (examples/prometheus) is added at the end of the top-level directory (a deferred call), and it
# links prometheus-cpp::pull into the http_load and crawler examples so that they can serve /metrics. Its
# integration test (tests/prometheus) is added by tests/CMakeLists.txt when the target exists.

option(REIN_WITH_PROMETHEUS "Build rein::prometheus (Prometheus metrics) when prometheus-cpp is found" ON)
if(NOT REIN_WITH_PROMETHEUS)
  return()
endif()

find_package(prometheus-cpp CONFIG QUIET)
if(NOT prometheus-cpp_FOUND OR NOT TARGET prometheus-cpp::core)
  message(STATUS "rein: prometheus-cpp not found (Debian: prometheus-cpp-dev): rein::prometheus is not built")
  return()
endif()
message(STATUS "rein: prometheus-cpp found (${prometheus-cpp_DIR}): rein::prometheus is built")

if(TARGET rein)
  set(REIN_PROMETHEUS_FLAVOUR rein)
else()
  set(REIN_PROMETHEUS_FLAVOUR standalone)
endif()

_rein_interface_target(rein_prometheus prometheus)
target_link_libraries(rein_prometheus INTERFACE rein::${REIN_PROMETHEUS_FLAVOUR} prometheus-cpp::core)

rein_install_component(rein_prometheus prometheus
  DEPENDENCIES "${PROJECT_SOURCE_DIR}/cmake/package/prometheus-dependencies.cmake.in")

# The examples: the throttle under load serving /metrics, and /metrics in http_load and the crawler.
function(_rein_prometheus_examples)
  if(NOT REIN_BUILD_EXAMPLES OR NOT TARGET prometheus-cpp::pull)
    return()
  endif()
  add_executable(prometheus_throttle "${PROJECT_SOURCE_DIR}/examples/prometheus/prometheus_throttle.cpp")
  target_link_libraries(prometheus_throttle PRIVATE rein::prometheus prometheus-cpp::pull rein_warnings)
  foreach(_rein_example http_load crawler)
    if(TARGET ${_rein_example})
      target_link_libraries(${_rein_example} PRIVATE rein::prometheus prometheus-cpp::pull)
      target_compile_definitions(${_rein_example} PRIVATE REIN_EXAMPLE_METRICS)
    endif()
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${PROJECT_SOURCE_DIR}" CALL _rein_prometheus_examples)
