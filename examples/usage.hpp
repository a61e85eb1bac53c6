// What every example does with its command line first: `--help` or `-h` prints its usage line (to stdout)
// and exits 0; a program without options refuses any other argument (usage to stderr, exit 2). The CTest
// tests example.<name>.help check both flags (examples/check_help.cmake).
#pragma once

#include <cstdio>
#include <string_view>

namespace rein_example {

/// Whether `--help` or `-h` is among the arguments; prints `usage` to stdout when it is.
inline bool asked_for_help(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg{argv[i]};
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage, stdout);
      return true;
    }
  }
  return false;
}

/// For a program that takes no arguments: whether any was given; prints it and `usage` to stderr when so.
inline bool unexpected_arguments(int argc, char** argv, const char* usage) {
  if (argc < 2) return false;
  std::fprintf(stderr, "unknown argument '%s'\n", argv[1]);
  std::fputs(usage, stderr);
  return true;
}

}  // namespace rein_example
