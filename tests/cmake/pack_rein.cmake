# CTest fixture: the files a user of rein needs (not tests, examples or build trees), as a tarball.
#   cmake -DREIN_SOURCE_DIR=<checkout> -DOUTPUT=<file.tar.gz> -P pack_rein.cmake
file(REMOVE "${OUTPUT}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -E tar czf "${OUTPUT}" -- CMakeLists.txt LICENSE cmake include
  WORKING_DIRECTORY "${REIN_SOURCE_DIR}"
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "packing ${REIN_SOURCE_DIR} into ${OUTPUT} failed: ${result}")
endif()
