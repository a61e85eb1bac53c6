# CTest tests example.<name>.help: the program answers --help and -h with its usage line and exits 0.
#   cmake -DPROGRAM=<path> -DNAME=<name> -P check_help.cmake
foreach(flag --help -h)
  execute_process(COMMAND "${PROGRAM}" ${flag} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 30)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "${NAME} ${flag}: exit status ${result}, expected 0\n${out}${err}")
  endif()
  if(NOT out MATCHES "^usage: ${NAME}( |\n)")
    message(FATAL_ERROR "${NAME} ${flag}: no \"usage: ${NAME}\" line first on stdout; got:\n${out}${err}")
  endif()
endforeach()
