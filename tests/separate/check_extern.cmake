# CTest separate.compilation.extern: the test units of tests/separate (not src.cpp) define no member of a
# waiting line, so REIN_SEPARATE_COMPILATION did leave the lines to src.cpp; and they call the admission
# (admit_locked, out of line with the define) of the two lines they park an acquire on: the semaphore's
# and the quota gate's.
#   cmake -DNM=<nm> -DOBJECTS=<object;object> -P check_extern.cmake
set(defined "")
set(called 0)
foreach(object IN LISTS OBJECTS)
  execute_process(COMMAND "${NM}" -C "${object}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_extern.cmake: ${NM} -C ${object} failed (${rc})")
  endif()
  # Members a unit would generate without the extern declarations: it uses each of them (a destructor
  # shuts its line down, an acquire is admitted, a grant dispatches).
  string(REGEX MATCHALL " [TtWw] rein::detail::limiter_core<[^\n]*::(shutdown|admit_locked|dispatch_locked)\\("
         found "${symbols}")
  list(APPEND defined ${found})
  string(REGEX MATCHALL " U rein::detail::limiter_core<[^\n]*::admit_locked\\(" calls "${symbols}")
  list(LENGTH calls n)
  math(EXPR called "${called} + ${n}")
endforeach()
if(defined)
  list(JOIN defined "\n" defined)
  message(FATAL_ERROR "check_extern.cmake: a test unit defines members of a waiting line:\n${defined}")
endif()
if(NOT called EQUAL 2)
  message(FATAL_ERROR "check_extern.cmake: the test units call admit_locked of ${called} lines, expected 2")
endif()
message(STATUS "check_extern.cmake: no waiting line member defined; admit_locked of 2 lines called")
