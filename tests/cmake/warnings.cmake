# Consumers build with strict warnings as errors, so rein's headers must be clean in a user's -Werror
# build too (headers from an imported target count as system headers; through add_subdirectory they do not).
function(consumer_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror)
  endif()
endfunction()
