// ingress: an HTTP server that admits each request through rein::beast's admission, per tenant and under a
// global adaptive limit, and answers the refused ones with 429 or 503, Retry-After and the IETF RateLimit
// fields.
//
//     ingress [--port P] [--rate R] [--burst B] [--concurrency N] [--max-wait MS] [--work MS] [--duration S]
//             [--global adaptive|semaphore|none] [--trusted-proxy ADDRESS]... [--proxy-hops H]
//
// Every request is keyed by its tenant: its X-API-Key field, or its client's address when it has none (the
// peer's, or behind trusted proxies, named by --trusted-proxy or counted by --proxy-hops, the one their
// X-Forwarded-For gives: rein::beast::trusted_proxies). Each tenant has a token bucket of R requests per
// second with a burst of B (defaults 100 and 10). All tenants share the global stage, in fair order (a
// tenant flooding it waits behind its own backlog): by default an adaptive limiter (AIMD) of at most N
// requests in flight (default 64), which lowers its limit when the work slows down; `--global semaphore`
// makes it a plain semaphore of N, and `--global none` turns admission off (the same server, for measuring
// what admission adds). A request waits up to --max-wait milliseconds (default 0: refused at once), then is
// served after --work milliseconds (default 0) with a 200 that carries its key's RateLimit fields.
// It listens on 127.0.0.1:P (default 0: a port the kernel picks), prints `listening on 127.0.0.1:<port>`,
// and stops on SIGINT or SIGTERM, or after --duration seconds, printing what it answered:
// `admitted=... rate_refused=... shed=... max_wait_us=... forwarded_malformed=...`. tests/beast/ingress.cpp
// drives it with ab and wrk.
#include "usage.hpp"

#if defined(REIN_STANDALONE_ASIO)

#include <iostream>

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv,
                                   "usage: ingress [options]\n"
                                   "  (this build uses standalone Asio: ingress needs Boost.Beast and only says so)\n"))
    return 0;
  std::cerr << "ingress needs Boost.Asio (Boost.Beast); this build uses standalone Asio\n";
  return 0;
}

#else

#include <rein/adaptive_limiter.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/beast/server.hpp>
#include <rein/beast/trusted_proxies.hpp>
#include <rein/outcome.hpp>
#include <rein/queue_order.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <type_traits>

namespace {

namespace net = boost::asio;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;

constexpr const char* usage =
    "usage: ingress [--port P] [--rate R] [--burst B] [--concurrency N] [--max-wait MS] [--work MS]\n"
    "               [--duration S] [--global adaptive|semaphore|none] [--trusted-proxy ADDRESS]...\n"
    "               [--proxy-hops H]\n";

enum class global_stage { adaptive, semaphore, none };

struct config {
  unsigned short port = 0;
  rein::beast::admission_options admission{.rate = 100, .burst = 10, .concurrency = 64};
  global_stage global = global_stage::adaptive;
  rein::beast::trusted_proxies_options proxies{};
  std::chrono::milliseconds work{0};
  std::chrono::seconds duration{0};  // 0: until a signal
};

// What the server answered, for the line it prints at the end.
struct tally {
  std::uint64_t admitted = 0, rate_refused = 0, shed = 0;
  std::chrono::nanoseconds max_wait{0};
};

[[noreturn]] void fail(std::string_view option, std::string_view wanted, std::string_view text) {
  std::cerr << "ingress: " << option << " wants " << wanted << ", got '" << text << "'\n" << usage;
  std::exit(2);
}

template <class Number>
Number parsed(std::string_view option, std::string_view text) {
  Number value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  bool negative = false;
  if constexpr (std::is_signed_v<Number>) negative = value < 0;
  if (ec != std::errc{} || end != text.data() + text.size() || negative) fail(option, "a number >= 0", text);
  return value;
}

global_stage parsed_global(std::string_view text) {
  if (text == "adaptive") return global_stage::adaptive;
  if (text == "semaphore") return global_stage::semaphore;
  if (text == "none") return global_stage::none;
  fail("--global", "adaptive, semaphore or none", text);
}

config parse(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view option = argv[i];
    if (i + 1 >= argc) {
      std::cerr << "ingress: unknown or incomplete option '" << option << "'\n" << usage;
      std::exit(2);
    }
    const std::string_view value = argv[++i];
    if (option == "--port") c.port = parsed<unsigned short>(option, value);
    else if (option == "--rate") c.admission.rate = parsed<double>(option, value);
    else if (option == "--burst") c.admission.burst = parsed<std::int64_t>(option, value);
    else if (option == "--concurrency") c.admission.concurrency = parsed<std::size_t>(option, value);
    else if (option == "--max-wait")
      c.admission.max_wait = std::chrono::milliseconds{parsed<std::int64_t>(option, value)};
    else if (option == "--work") c.work = std::chrono::milliseconds{parsed<std::int64_t>(option, value)};
    else if (option == "--duration") c.duration = std::chrono::seconds{parsed<std::int64_t>(option, value)};
    else if (option == "--global") c.global = parsed_global(value);
    else if (option == "--trusted-proxy") c.proxies.addresses.emplace_back(value);
    else if (option == "--proxy-hops") c.proxies.hops = parsed<std::size_t>(option, value);
    else {
      std::cerr << "ingress: unknown option '" << option << "'\n" << usage;
      std::exit(2);
    }
  }
  // The API key names the tenant; a request without one is keyed by its client's address in session().
  c.admission.key = [](const http::request_header<>& h) { return std::string(h["X-API-Key"]); };
  // The global stage waits as each tenant: fair shares of the slots while tenants wait.
  c.admission.order = rein::queue_order::fair;
  return c;
}

// No admission (--global none): the same session, to measure what admission adds.
struct no_admission {};

http::response<http::string_body> ok_for(const http::request<http::string_body>& request) {
  http::response<http::string_body> ok{http::status::ok, request.version()};
  ok.set(http::field::content_type, "text/plain");
  ok.keep_alive(request.keep_alive());
  ok.body() = "ok\n";
  ok.prepare_payload();
  return ok;
}

// One keep-alive connection: read a request, admit it, answer, until the client closes.
template <class Admission>
net::awaitable<void> session(boost::beast::tcp_stream stream, Admission& admission,
                             rein::beast::trusted_proxies& proxies, const config& c, tally& counts) {
  const auto peer = stream.socket().remote_endpoint().address();
  boost::beast::flat_buffer buffer;
  for (;;) {
    http::request<http::string_body> request;
    co_await http::async_read(stream, buffer, request, net::use_awaitable);
    http::response<http::string_body> ok = ok_for(request);
    if constexpr (std::is_same_v<Admission, no_admission>) {
      ++counts.admitted;
      if (c.work > 0ms) co_await net::steady_timer(stream.get_executor(), c.work).async_wait(net::use_awaitable);
    } else {
      // Keyed by the API key (the admission's key function), or by the client's address when there is none.
      // (Not a conditional expression: GCC 12 miscompiles co_await in the operands of ?:.)
      rein::beast::admission_result admitted;
      if (request.find("X-API-Key") == request.end())
        admitted = co_await admission.admit(request, proxies.client(request, peer).key());
      else admitted = co_await admission.admit(request);
      counts.max_wait = std::max(counts.max_wait, admitted.waited());
      if (!admitted) {
        ++(admitted.why() == rein::beast::refusal::rate ? counts.rate_refused : counts.shed);
        co_await http::async_write(stream, admitted.response(), net::use_awaitable);
        if (!admitted.response().keep_alive()) break;
        continue;
      }
      ++counts.admitted;
      if (c.work > 0ms) co_await net::steady_timer(stream.get_executor(), c.work).async_wait(net::use_awaitable);
      admitted.state()->set_fields(ok, admission.get_options().policy);
      // The work is done: the slot goes back before the write, and the adaptive stage learns how long the
      // work took (a semaphore ignores the outcome).
      admitted.permit().complete(rein::outcome::success);
    }
    co_await http::async_write(stream, ok, net::use_awaitable);
    if (!ok.keep_alive()) break;
  }
  stream.socket().shutdown(tcp::socket::shutdown_send);
}

template <class Admission>
net::awaitable<void> listen(tcp::acceptor& acceptor, Admission& admission, rein::beast::trusted_proxies& proxies,
                            const config& c, tally& counts) {
  for (;;) {
    tcp::socket socket = co_await acceptor.async_accept(net::use_awaitable);
    // A client that goes away mid-request ends its session only.
    net::co_spawn(acceptor.get_executor(),
                  session(boost::beast::tcp_stream(std::move(socket)), admission, proxies, c, counts), net::detached);
  }
}

template <class Admission>
int serve(net::io_context& io, Admission& admission, const config& c) {
  rein::beast::trusted_proxies proxies(c.proxies);
  tcp::acceptor acceptor(io, {net::ip::make_address("127.0.0.1"), c.port});
  std::cout << "listening on 127.0.0.1:" << acceptor.local_endpoint().port() << std::endl;
  tally counts;
  net::co_spawn(io, listen(acceptor, admission, proxies, c, counts), net::detached);
  net::signal_set signals(io, SIGINT, SIGTERM);
  net::steady_timer deadline(io);
  const auto stop = [&] {
    signals.cancel();
    deadline.cancel();
    io.stop();
  };
  signals.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) stop();
  });
  if (c.duration > 0s) {
    deadline.expires_after(c.duration);
    deadline.async_wait([&](boost::system::error_code ec) {
      if (!ec) stop();
    });
  }
  io.run();
  std::cout << "admitted=" << counts.admitted << " rate_refused=" << counts.rate_refused << " shed=" << counts.shed
            << " max_wait_us=" << std::chrono::duration_cast<std::chrono::microseconds>(counts.max_wait).count()
            << " forwarded_malformed=" << proxies.malformed() << std::endl;
  return 0;
}

int serve(const config& c) {
  net::io_context io;
  switch (c.global) {
    case global_stage::none: {
      no_admission none;
      return serve(io, none, c);
    }
    case global_stage::semaphore: {
      rein::beast::admission admission(io, c.admission);
      return serve(io, admission, c);
    }
    case global_stage::adaptive: break;
  }
  // At most --concurrency in flight, starting there: the limit falls when the work slows down (a success
  // slower than 1.75 x the fastest recent one counts as congestion) and climbs back as it recovers.
  const auto ceiling = static_cast<double>(c.admission.concurrency);
  rein::beast::admission_options options = c.admission;
  options.concurrency = 0;
  options.order = rein::queue_order::fifo;  // the limiter's own options choose its order
  rein::beast::adaptive_admission<rein::algo::aimd> admission(
      io, std::move(options),
      rein::aimd_limiter(io, {.initial_limit = ceiling, .min_limit = 1, .max_limit = ceiling},
                         {.name = "ingress", .order = rein::queue_order::fair}));
  return serve(io, admission, c);
}

}  // namespace

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  const config c = parse(argc, argv);
  try {
    return serve(c);
  } catch (const std::exception& e) {
    std::cerr << "ingress: " << e.what() << '\n';
    return 1;
  }
}

#endif
