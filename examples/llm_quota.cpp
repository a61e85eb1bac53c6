// Staying inside an LLM provider's quotas: per model, requests per minute (RPM) and tokens per minute (TPM)
// charged together, with the token count estimated before each call and reconciled after it, a cap on calls
// in flight, and 429 handling, all through one rein::throttle:
//
//     rein::throttle throttle(gates, in_flight, rpm, rein::by_tokens(tpm));
//     auto guard = co_await throttle.acquire(model, {.requests = 1, .tokens = estimate});
//     auto answer = co_await call_model(...);
//     guard.reconcile({.requests = 1, .tokens = answer.usage});  // refund what the estimate over-charged
//     guard.complete(rein::outcome::success);                     // or guard.reject(retry_after) on a 429
//
// The estimate (the prompt plus the most the answer may use, `max_tokens`) is charged before the call, since
// the real count is known only from the response's `usage`; the reconcile gives the difference back at once
// to the calls still waiting (an under-estimate would be charged as debt instead). Both budgets are taken
// together at the moment of sending, so neither is ever exceeded, in any window.
//
// A fake provider answers after 20 ms and enforces the same quotas itself (it answers 429 with Retry-After
// when a model's budget is exhausted). Two models with their own quotas (those of a large tier, with bursts
// of a tenth of a second) get 30 calls each; the same calls run with and without the reconcile, and the
// program checks that the provider never said 429 and that each model's kept tokens stayed within its quota.
#include "usage.hpp"

#include <rein/keyed.hpp>
#include <rein/quota.hpp>
#include <rein/quota_gate.hpp>
#include <rein/semaphore.hpp>
#include <rein/throttle.hpp>
#include <rein/token_bucket.hpp>
#include <rein/algo/token_bucket.hpp>

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

// The provider's published limits per model, per minute, and how much of a burst we allow ourselves (many
// providers enforce the limit over short sub-windows).
struct model_quota {
  const char* model;
  double rpm;
  double tpm;
};
constexpr model_quota quotas[] = {{"small-model", 12'000, 3'000'000}, {"large-model", 6'000, 1'200'000}};
constexpr double burst_seconds = 0.1;
constexpr int calls = 30;  // per model
constexpr int max_tokens = 600;

// The provider's per-minute quota as a bucket, with our own burst stated.
rein::token_bucket_options per_second(double per_minute) {
  const rein::quota q = rein::per_minute(per_minute);
  return {.rate = q, .capacity = static_cast<std::int64_t>(q.per_second() * burst_seconds)};
}

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

// A stand-in for the provider: per model, the same RPM and TPM buckets, charged with the real usage when a
// call arrives; a call beyond them gets 429 with a Retry-After. Answers after 20 ms.
struct provider {
  struct budget {
    rein::algo::token_bucket requests;
    rein::algo::token_bucket tokens;
  };
  std::vector<budget> budgets;
  int too_many = 0;

  provider() {
    const auto now = std::chrono::steady_clock::now();
    for (const model_quota& q : quotas)
      budgets.push_back(budget{rein::algo::token_bucket(pure(per_second(q.rpm)), now),
                               rein::algo::token_bucket(pure(per_second(q.tpm)), now)});
  }

  struct answer {
    int status;
    int usage;
    std::chrono::nanoseconds retry_after;
  };

  net::awaitable<answer> call(std::size_t model, const request& r) {
    const auto now = std::chrono::steady_clock::now();
    budget& b = budgets[model];
    const int usage = r.prompt_tokens + r.completion_tokens;
    if (b.requests.try_take(1, now) != rein::algo::take_result::allowed) co_return refuse(b.requests, 1, now);
    if (b.tokens.try_take(usage, now) != rein::algo::take_result::allowed) {
      b.requests.refund(1, now);
      co_return refuse(b.tokens, usage, now);
    }
    net::steady_timer latency(co_await net::this_coro::executor, 20ms);
    co_await latency.async_wait(net::use_awaitable);
    co_return answer{200, usage, {}};
  }

  static rein::algo::token_bucket_options pure(const rein::token_bucket_options& o) {
    return {.rate = o.rate, .capacity = o.capacity};
  }

  answer refuse(const rein::algo::token_bucket& b, int n, std::chrono::steady_clock::time_point now) {
    ++too_many;
    const auto ready = b.ready_at(n, now).value_or(now + 1s);
    return {429, 0, std::chrono::duration_cast<std::chrono::nanoseconds>(ready - now)};
  }
};

// Our side of the quota: a gate per model (a 429 pauses that model for every caller), at most 8 calls in
// flight, and per model an RPM and a TPM bucket, the TPM one charged the call's tokens.
struct client {
  rein::keyed<rein::quota_gate> gates;
  rein::semaphore in_flight;
  rein::keyed<rein::token_bucket> rpm;
  rein::keyed<rein::token_bucket> tpm;
  rein::throttle<rein::keyed<rein::quota_gate>, rein::semaphore, rein::keyed<rein::token_bucket>,
                 rein::weighted_stage<rein::keyed<rein::token_bucket>, rein::by_tokens_t>>
      throttle;

  explicit client(net::io_context& io)
      : gates(io, {}),
        in_flight(io, 8),
        rpm(io, per_second(quotas[0].rpm)),
        tpm(io, per_second(quotas[0].tpm)),
        throttle(gates, in_flight, rpm, rein::by_tokens(tpm)) {
    for (const model_quota& q : quotas) {
      rpm.set_override(q.model, per_second(q.rpm));
      tpm.set_override(q.model, per_second(q.tpm));
    }
  }
};

struct totals {
  std::int64_t charged = 0;
  std::int64_t used = 0;
  int done = 0;
  steady::time_point last_done{};
};

net::awaitable<void> chat(client& c, provider& p, std::size_t model, const request& r, bool reconcile, totals& sum) {
  const std::size_t estimate = static_cast<std::size_t>(r.estimated_prompt + max_tokens);
  for (;;) {
    auto guard = co_await c.throttle.acquire(quotas[model].model, {.requests = 1, .tokens = estimate});
    const provider::answer a = co_await p.call(model, r);
    if (a.status == 429) {
      guard.reject(std::optional<rein::throttle_guard<decltype(c.throttle)>::duration>(
          std::chrono::duration_cast<steady::duration>(a.retry_after)));
      continue;  // the gate holds this model's callers until the Retry-After has passed
    }
    if (reconcile) guard.reconcile({.requests = 1, .tokens = static_cast<std::size_t>(a.usage)});
    guard.complete(rein::outcome::success);
    sum.charged += static_cast<std::int64_t>(reconcile ? static_cast<std::size_t>(a.usage) : estimate);
    sum.used += a.usage;
    ++sum.done;
    sum.last_done = steady::now();
    co_return;
  }
}

// Returns false if a figure is not what it must be.
bool run(const std::vector<request>& reqs, bool reconcile) {
  net::io_context io;
  client c(io);
  provider p;
  std::vector<totals> sums(std::size(quotas));
  const steady::time_point start = steady::now();
  for (std::size_t m = 0; m < std::size(quotas); ++m)
    for (const request& r : reqs)
      net::co_spawn(io, chat(c, p, m, r, reconcile, sums[m]), [](std::exception_ptr e) {
        if (e) std::rethrow_exception(e);
      });
  io.run();
  bool ok = p.too_many == 0;
  for (std::size_t m = 0; m < std::size(quotas); ++m) {
    const totals& sum = sums[m];
    const double seconds = std::chrono::duration<double>(sum.last_done - start).count();
    // What the TPM bucket kept (charged minus refunds) never passes one burst plus the rate times the time.
    const double allowed = quotas[m].tpm / 60 * seconds + quotas[m].tpm / 60 * burst_seconds;
    ok = ok && sum.done == calls && static_cast<double>(sum.charged) <= allowed;
    std::printf("%-16s %-12s %6.0f ms %5d %9lld %9lld %9.0f\n", reconcile ? "reconciled" : "not reconciled",
                quotas[m].model, seconds * 1000, sum.done, static_cast<long long>(sum.charged),
                static_cast<long long>(sum.used), allowed);
  }
  const rein::throttle_snapshot s = c.throttle.snapshot();
  std::printf("%-16s 429s from the provider: %d; throttle: %llu admitted, %llu failed\n", "", p.too_many,
              static_cast<unsigned long long>(s.admitted_total), static_cast<unsigned long long>(s.failed_total));
  return ok;
}

}  // namespace

constexpr const char* usage =
    "usage: llm_quota [--help]\n"
    "  30 calls per model to a simulated LLM within RPM and TPM quotas, with and without reconcile (about 1 s)\n";

int main(int argc, char** argv) {
  if (rein_example::asked_for_help(argc, argv, usage)) return 0;
  if (rein_example::unexpected_arguments(argc, argv, usage)) return 2;
  const std::vector<request> reqs = make_requests();
  std::printf("%d calls per model; bursts of %.1f s of each quota\n\n", calls, burst_seconds);
  std::printf("%-16s %-12s %9s %5s %9s %9s %9s\n", "", "model", "elapsed", "calls", "kept", "used", "allowed");
  const bool ok = run(reqs, true) && run(reqs, false);
  std::printf("\nkept: the tokens the TPM bucket kept (the estimates, less what the reconcile gave back); used:\n"
              "what the responses reported; allowed: TPM x elapsed + one burst, never passed by kept.\n%s\n",
              ok ? "every call succeeded, no 429, every model within its quota" : "FAILED: a figure is wrong");
  return ok ? 0 : 1;
}
