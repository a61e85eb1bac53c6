# Configures, builds and runs one consumer project from scratch (CTest's consumer_* tests).
#   cmake -DSOURCE_DIR=... -DBINARY_DIR=... -DGENERATOR=... -DMAKE_PROGRAM=... -DCXX_COMPILER=...
#         -DBUILD_TYPE=... -DARGS=<-Dx=y|-Dz=w> -DPROGRAMS=<a|b> [-DINSTALLS_NOTHING=ON] -P run_consumer.cmake
# INSTALLS_NOTHING: the consumer has no install rules of its own, so its `cmake --install` must install no
# file at all (rein's REIN_INSTALL is off when rein is not the top-level project).
# ARGS and PROGRAMS are |-separated: a ; would split the argument in add_test().
string(REPLACE "|" ";" args "${ARGS}")
string(REPLACE "|" ";" programs "${PROGRAMS}")

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "consumer ${SOURCE_DIR}: ${what} failed (${result})")
  endif()
endfunction()

file(REMOVE_RECURSE "${BINARY_DIR}")
set(configure "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}"
              "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
if(MAKE_PROGRAM)
  list(APPEND configure "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
if(BUILD_TYPE)
  list(APPEND configure "-DCMAKE_BUILD_TYPE=${BUILD_TYPE}")
endif()
run(configure ${configure} ${args})
run(build "${CMAKE_COMMAND}" --build "${BINARY_DIR}")
foreach(program IN LISTS programs)
  run("running ${program}" "${BINARY_DIR}/${program}")
endforeach()
if(INSTALLS_NOTHING)
  set(prefix "${BINARY_DIR}/install-prefix")
  run(install "${CMAKE_COMMAND}" --install "${BINARY_DIR}" --prefix "${prefix}")
  file(GLOB_RECURSE installed "${prefix}/*")
  if(installed)
    list(LENGTH installed count)
    list(GET installed 0 first)
    message(FATAL_ERROR "consumer ${SOURCE_DIR}: its cmake --install installed ${count} files, "
                        "such as ${first}")
  endif()
endif()
