# CTest separate.compilation.extern: the test units of tests/separate (not src.cpp) define no member of a
# waiting line, so REIN_SEPARATE_COMPILATION did leave the lines to src.cpp; and each refers to a member
# that src.cpp defines (with g++ and clang++ alike, at least the limiters' constructors; which others depends
# on what the compiler chose to inline).
#   cmake -DNM=<nm> -DOBJECTS=<object;object> -P check_extern.cmake
set(defined "")
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND "${NM}" -C "${object}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_extern.cmake: ${NM} -C ${object} failed (${rc})")
  endif()
  # Members a unit would generate without the extern declarations: it uses each of them (a destructor
  # shuts its line down, an acquire is admitted, a grant dispatches).
  string(REGEX MATCHALL " [TtWw] rein::detail::limiter_core<[^\n]*::(shutdown|admit_locked|dispatch_locked|on_timer|cancel_wait|deliver|abandon|release_permit|try_acquire)\\("
         found "${symbols}")
  list(APPEND defined ${found})
  # And the waits a coroutine awaits (co_await sem.acquire(), and the throttle's slot-bound waits), compiled
  # with their handlers in src.cpp.
  string(REGEX MATCHALL " [TtWw] void rein::detail::limiter_core<[^\n]*::async_acquire<[a-z:]*(cancellation_slot_binder<[a-z:]*)?detail::awaitable_[^\n]*"
         found "${symbols}")
  list(APPEND defined ${found})
  string(REGEX MATCH " U rein::(detail::limiter_core|basic_semaphore|basic_quota_gate|basic_rate_limiter|keyed)<"
         external "${symbols}")
  if(NOT external)
    message(FATAL_ERROR "check_extern.cmake: ${object} refers to no member that src.cpp defines")
  endif()
endforeach()
if(defined)
  list(JOIN defined "\n" defined)
  message(FATAL_ERROR "check_extern.cmake: a test unit defines members of a waiting line:\n${defined}")
endif()
message(STATUS "check_extern.cmake: no waiting line member defined; every unit refers to src.cpp's")
