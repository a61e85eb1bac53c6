# CTest fixture: a fresh install of rein (the "rein" install component) into PREFIX.
#   cmake -DREIN_BINARY_DIR=<rein's build tree> -DPREFIX=<dir> -P install_rein.cmake
file(REMOVE_RECURSE "${PREFIX}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" --install "${REIN_BINARY_DIR}" --prefix "${PREFIX}" --component rein
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "installing rein into ${PREFIX} failed: ${result}")
endif()
