// A throttle under load, its metrics on /metrics for Prometheus (rein::prometheus, prometheus-cpp's exposer).
//
//   prometheus_throttle [--port P] [--seconds S] [--serve-seconds T]
//
// Eight workers call `throttle.try_acquire(host)` over three hosts for S seconds (default 2): a token bucket
// of 50 per second (burst 5), at most 2 calls per host and 4 overall; an admitted call "runs" 5 ms. Refusals
// are counted by the stage that refused (rein_rejected_total{reason="rate"}, "per_key", "global"), and each
// stage's grants by what became of them (rein_throttle_stage_acquired_total{as=...}). Then the
// load stops, the final counts are printed (the lines a test compares with what Prometheus scraped), and
// /metrics stays up for T more seconds (default 0: exit at once; -1: until killed).
//
// It prints `listening on 127.0.0.1:<port>` first (P = 0, the default, picks a free port).
#include <rein/keyed.hpp>
#include <rein/prometheus/collector.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>

#include <prometheus/exposer.h>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

namespace net = rein::net;  // Boost.Asio, or standalone Asio with REIN_STANDALONE_ASIO
using namespace std::chrono_literals;

namespace {

struct arguments {
  std::string port = "0";
  double seconds = 2.0;
  double serve_seconds = 0.0;
};

arguments parse(int argc, char** argv) {
  arguments a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--port") a.port = argv[i + 1];
    else if (flag == "--seconds") a.seconds = std::atof(argv[i + 1]);
    else if (flag == "--serve-seconds") a.serve_seconds = std::atof(argv[i + 1]);
    else {
      std::cerr << "usage: prometheus_throttle [--port P] [--seconds S] [--serve-seconds T]\n";
      std::exit(2);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const arguments args = parse(argc, argv);
  net::io_context io;

  rein::token_bucket rate(io, {.rate = 50, .capacity = 5}, {.name = "rate"});
  rein::semaphore global(io, 4, {.name = "global"});
  rein::keyed<rein::semaphore> per_host(io.get_executor(), std::size_t{2}, {}, {.name = "per_host"});
  rein::throttle throttle(per_host, global, rate, {.name = "outbound"});

  // Registered once; read at every scrape, never on the limiters' paths.
  auto metrics = std::make_shared<rein::prometheus::collector>();
  metrics->add(throttle);
  metrics->add(rate);
  metrics->add(global);
  metrics->add_keyed(per_host, {}, {.max_keys = 10});
  prometheus::Exposer exposer("127.0.0.1:" + args.port);
  exposer.RegisterCollectable(metrics);
  std::cout << "listening on 127.0.0.1:" << exposer.GetListeningPorts().at(0) << std::endl;

  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(args.seconds);
  for (int worker = 0; worker < 8; ++worker) {
    net::co_spawn(
        io,
        [&, worker]() -> net::awaitable<void> {
          net::steady_timer timer(io);
          const std::string host = "host-" + std::to_string(worker % 3);
          while (std::chrono::steady_clock::now() < end) {
            auto guard = throttle.try_acquire(host);
            timer.expires_after(guard ? 5ms : 2ms);  // a call, or a short back-off after a refusal
            co_await timer.async_wait(net::use_awaitable);
            if (guard) guard.complete(rein::outcome::success);
          }
        },
        net::detached);
  }
  io.run();

  // The load has stopped: these numbers no longer change, and a scrape from now on shows the same.
  const rein::throttle_snapshot s = throttle.snapshot();
  std::cout << "throttle: " << s << '\n'
            << "rate: " << rate.snapshot() << '\n'
            << "global: " << global.snapshot() << '\n'
            << "per_host: " << per_host.snapshot() << '\n';
  s.for_each_rejected([](rein::reject_reason why, std::uint64_t n) {
    std::cout << "rein_rejected_total{limiter=\"outbound\",reason=\"" << rein::to_string(why) << "\"} " << n << '\n';
  });
  std::cout << "rein_acquired_total{limiter=\"outbound\"} " << s.acquired_total << '\n';
  // Each stage's grants, told apart: a grant to a call refused at a later stage (the rate, mostly) is
  // abandoned, not admitted; summed over `as` they are the stage's own rein_acquired_total.
  for (const rein::throttle_stage_counts& c : s.stages) {
    const std::string series = "rein_throttle_stage_acquired_total{limiter=\"outbound\",stage=\"" +
                               std::to_string(c.position) + "\",kind=\"" + rein::to_string(c.kind) + "\",as=\"";
    std::cout << series << "admitted\"} " << c.admitted << '\n'
              << series << "readmitted\"} " << c.readmitted << '\n'
              << series << "abandoned\"} " << c.abandoned << '\n';
  }
  std::cout << "done" << std::endl;

  if (args.serve_seconds < 0) {
    for (;;) std::this_thread::sleep_for(1h);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(args.serve_seconds));
  return 0;
}
