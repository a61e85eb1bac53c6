// What a project that depends on rein writes first: the umbrella header, an error code from rein's
// category, an io_context of the Asio flavour rein was configured with, and rein's version macros.
#include <rein.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#else
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#endif

#include <cstdio>
#include <string_view>

int main() {
  rein::net::io_context context;
  bool ran = false;
  rein::net::post(context, [&ran] { ran = true; });
  context.run();

  const rein::error_code ec = rein::errc::queue_full;
  const std::string_view category = ec.category().name();
  if (!ran || category != "rein") {
    std::fprintf(stderr, "rein consumer: unexpected result (ran=%d, category=%s)\n", ran ? 1 : 0,
                 ec.category().name());
    return 1;
  }
  static_assert(REIN_VERSION_MAJOR >= 0 && REIN_VERSION_MINOR >= 0 && REIN_VERSION_PATCH >= 0);
  std::printf("rein %s consumer (%s): %s\n", REIN_VERSION, REIN_CONSUMER_KIND, ec.message().c_str());
  return 0;
}
