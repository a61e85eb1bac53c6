// Staying inside an LLM provider's quota: requests per minute (RPM) and tokens per minute (TPM) together
// with token counts estimated before each call and reconciled after it.
//
// Every call is charged before it is sent: 1 request, and its *estimated* tokens (the prompt plus the most the
// answer may use, `max_tokens`), because the real count is known only from the response's `usage`. When the
// response comes back, the difference is refunded, so the next calls do not wait for tokens nobody used:
//
//     co_await tokens.acquire(estimate);     // TPM first: the scarcer budget for long prompts
//     co_await requests.acquire();           // RPM (a rate wait holds nothing, so the order cannot deadlock)
//     auto slot = co_await in_flight.acquire();
//     auto usage = co_await call_model(...);
//     tokens.refund(estimate - usage);       // reconcile
//
// A fake model answers after 20 ms with a usage below the estimate. The same 30 calls run twice, with and without
// the refund; with it they finish sooner, and neither run ever exceeds the quota. The account's limits are those
// of a large tier (RPM 12,000 and TPM 3,000,000), with bursts of a tenth of a second, so that the whole program
// takes about a second.
#include "usage.hpp"

#include <rein/semaphore.hpp>
#include <rein/token_bucket.hpp>

#if defined(REIN_STANDALONE_ASIO)
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#else
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

namespace net = rein::net;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

// The provider's published limits, per minute, and how much of a burst we allow ourselves (many providers
// enforce the limit over short sub-windows).
constexpr double rpm = 12'000;
constexpr double tpm = 3'000'000;
constexpr double burst_seconds = 0.1;
constexpr int calls = 30;
constexpr int max_tokens = 600;

struct request {
  int prompt_tokens;      // what the prompt really is (the model counts it exactly)
  int estimated_prompt;   // our guess before sending: characters / 4, rounded up generously
  int completion_tokens;  // how long the answer turns out to be, at most max_tokens
};

// Deterministic prompts and answers (a linear congruential generator), so that both runs see the same calls.
std::vector<request> make_requests() {
  std::vector<request> out;
  std::uint32_t state = 2024;
  auto next = [&state](int bound) {
    state = state * 1664525u + 1013904223u;
    return static_cast<int>((state >> 8) % static_cast<std::uint32_t>(bound));
  };
  for (int i = 0; i < calls; ++i) {
    const int prompt = 150 + next(250);
    out.push_back({prompt, prompt + prompt / 5, 80 + next(max_tokens - 80)});
  }
  return out;
}

// A stand-in for the provider's API: answers after 20 ms and reports the tokens it used.
net::awaitable<int> call_model(const request& r) {
  net::steady_timer latency(co_await net::this_coro::executor, 20ms);
  co_await latency.async_wait(net::use_awaitable);
  co_return r.prompt_tokens + r.completion_tokens;
}

struct account {
  rein::token_bucket requests;
  rein::token_bucket tokens;
  rein::semaphore in_flight;

  explicit account(net::io_context& io)
      : requests(io, {.rate = rpm / 60, .capacity = static_cast<std::int64_t>(rpm / 60 * burst_seconds)}),
        tokens(io, {.rate = tpm / 60, .capacity = static_cast<std::int64_t>(tpm / 60 * burst_seconds)}),
        in_flight(io, 8) {}
};

struct totals {
  std::int64_t charged = 0;
  std::int64_t used = 0;
  steady::time_point last_done{};
};

net::awaitable<void> chat(account& acct, const request& r, bool reconcile, totals& sum) {
  const std::int64_t estimate = r.estimated_prompt + max_tokens;
  // A request larger than the burst could never be granted (errc::exceeds_capacity). Charging the whole burst
  // lets it through once the bucket is full; better, size burst_seconds so that this never happens.
  const std::int64_t charge = std::min(estimate, acct.tokens.capacity());
  co_await acct.tokens.acquire(static_cast<std::size_t>(charge));
  co_await acct.requests.acquire();
  rein::permit slot = co_await acct.in_flight.acquire();  // concurrency last: rate waits hold no slot
  const std::int64_t used = co_await call_model(r);
  slot.release();
  if (reconcile && used < charge) {
    acct.tokens.refund(static_cast<std::size_t>(charge - used));
  } else if (used > charge) {
    // The estimate was short (a prompt longer than guessed): pay the rest now, so the quota stays true.
    co_await acct.tokens.acquire(static_cast<std::size_t>(std::min(used - charge, acct.tokens.capacity())));
  }
  sum.charged += charge;
  sum.used += used;
  sum.last_done = steady::now();
}

void run(const std::vector<request>& reqs, bool reconcile) {
  net::io_context io;
  account acct(io);
  totals sum;
  const steady::time_point start = steady::now();
  for (const request& r : reqs) {
    net::co_spawn(io, chat(acct, r, reconcile, sum), [](std::exception_ptr e) {
      if (e) std::rethrow_exception(e);
    });
  }
  io.run();
  const double seconds = std::chrono::duration<double>(sum.last_done - start).count();
  const rein::token_bucket_snapshot t = acct.tokens.snapshot();
  const rein::token_bucket_snapshot q = acct.requests.snapshot();
  // What the bucket kept (charged minus refunded) can never pass one burst plus the rate times the time.
  const std::int64_t kept = reconcile ? sum.used : sum.charged;
  const double allowed = tpm / 60 * seconds + static_cast<double>(t.capacity);
  std::printf("%-16s %6.0f ms %9lld %9lld %9lld %9.0f %15.1f\n", reconcile ? "with refunds" : "without refunds",
              seconds * 1000, static_cast<long long>(sum.charged), static_cast<long long>(sum.used),
              static_cast<long long>(kept), allowed,
              std::chrono::duration<double, std::milli>(t.wait_total + q.wait_total).count() / calls);
}

}  // namespace

constexpr const char* usage =
    "usage: llm_quota [--help]\n"
    "  30 calls to a simulated LLM within RPM and TPM quotas, with and without refunds (about 1 s)\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  if (rein_example::unexpected_arguments(argc, argv, usage)) return 2;
  const std::vector<request> reqs = make_requests();
  std::printf("%d calls; quota RPM %.0f, TPM %.0f; bursts of %.1f s (%lld requests, %lld tokens)\n\n", calls, rpm, tpm,
              burst_seconds, static_cast<long long>(rpm / 60 * burst_seconds),
              static_cast<long long>(tpm / 60 * burst_seconds));
  std::printf("%-16s %9s %9s %9s %9s %9s %15s\n", "", "elapsed", "charged", "used", "kept", "allowed",
              "mean wait (ms)");
  run(reqs, true);
  run(reqs, false);
  std::printf("\ncharged: estimates taken before the calls; used: what the responses reported; kept: what the\n"
              "token bucket kept (charged minus refunds); allowed: TPM x elapsed + one burst, never passed by kept.\n"
              "With refunds, what a call was charged but did not use goes back at once to the calls still waiting.\n");
}
