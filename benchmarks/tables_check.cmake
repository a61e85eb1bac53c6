# CTest test benchmark_tables: benchmarks/tables.sh regenerates the tables of docs/benchmarks.md (in a copy of
# the page) from a short run of rein_benchmarks, so that the script, the page's markers and the benchmark
# names stay in step.
#   cmake -DBENCHMARKS=<rein_benchmarks> -DSOURCE_DIR=<checkout> -DWORK_DIR=<dir> -P tables_check.cmake
set(json "${WORK_DIR}/tables.json")
set(page "${WORK_DIR}/benchmarks.md")
execute_process(
  COMMAND "${BENCHMARKS}"
          "--benchmark_filter=^(uncontended/reactor_on/(floor_nested_awaitable|rein_semaphore)|throttle/acquire/2_stages/(floor_stage_acquire_sum|rein_throttle)|keyed/get_hit/10_keys/rein_keyed)$"
          --benchmark_min_time=0.0001 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
          "--benchmark_out=${json}" --benchmark_out_format=json
  OUTPUT_QUIET ERROR_VARIABLE errors RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "${BENCHMARKS} failed (${result}):\n${errors}")
endif()
configure_file("${SOURCE_DIR}/docs/benchmarks.md" "${page}" COPYONLY)
execute_process(COMMAND sh "${SOURCE_DIR}/benchmarks/tables.sh" --update "${page}" "${json}" RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "benchmarks/tables.sh failed (${result})")
endif()
file(READ "${page}" text)
foreach(pattern
    "\\| `rein::semaphore` \\(thread-safe\\) \\| [0-9.,]+ \\([0-9.]+\\) \\|"
    "\\| `co_await acquire`, 2 \\| \\| [0-9.,]+ \\| \\| [0-9.,]+ \\([0-9.]+\\) \\|"
    "\\| hit, 10 keys \\| \\| \\| [0-9.,]+ \\| \\|")
  if(NOT text MATCHES "${pattern}")
    message(FATAL_ERROR "tables.sh wrote no row matching ${pattern}")
  endif()
endforeach()
message(STATUS "tables.sh regenerated the tables of a copy of docs/benchmarks.md")
