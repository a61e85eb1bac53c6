// What the nginx integration tests share: the load generator of examples/http_load, pointed at the fixture.
#pragma once

#include "../../../examples/http_load.hpp"
#include "nginx.hpp"

#if REIN_HTTP_LOAD_AVAILABLE

#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

namespace rein_test {

/// A run of `workers` workers for `duration` against `path` on the fixture's nginx, no limiter configured.
inline http_load::config load_config(const nginx_server& nginx, std::string_view path, http_load::clock::duration duration,
                                     int workers = 16) {
  http_load::config c;
  c.url = *http_load::parse_url(nginx.url(path));
  c.workers = workers;
  c.duration = duration;
  c.quota_gate = false;
  return c;
}

/// Runs the load and prints its report (CTest shows it with --output-on-failure or -V).
inline http_load::report run_and_print(const http_load::config& c, std::string_view title) {
  http_load::report r = http_load::run(c);
  std::ostringstream text;
  http_load::print(text, r);
  std::cout << "==== " << title << '\n' << text.str() << std::flush;
  return r;
}

/// part / whole, 0 when whole is 0.
inline double share(std::uint64_t part, std::uint64_t whole) {
  return whole == 0 ? 0.0 : static_cast<double>(part) / static_cast<double>(whole);
}

}  // namespace rein_test

#endif
