# cmake -DCXX=<compiler> -DINCLUDE_DIR=<include> -DSOURCE=<file.cpp> -DEXPECTED=<text> -P check_diagnostic.cmake
# Compiles SOURCE (syntax only) and requires that it fails with EXPECTED in the compiler's messages: a
# mistake a user can make gives rein's own readable message, not only an error deep inside a template.
execute_process(
  COMMAND "${CXX}" -std=c++20 -fsyntax-only "-I${INCLUDE_DIR}" "${SOURCE}"
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()
string(FIND "${out}${err}" "${EXPECTED}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${SOURCE} failed without the expected message \"${EXPECTED}\":\n${err}")
endif()
message(STATUS "${SOURCE}: fails with \"${EXPECTED}\"")
