/// @file
/// rein: every public header in one include.
///
/// It includes each header under rein/ except detail/ (not API), redis/ (the Redis-backed limiters, which
/// need hiredis: link rein::redis and include <rein/redis/shared_token_bucket.hpp>) and the test kit
/// (<rein/testing.hpp>). Adding a public header means adding it here: the test `umbrella_header` fails
/// until this list and the headers agree.
#pragma once

#include <rein/config.hpp>  // first: it defines REIN_HAS_BEAST, tested below

#include <rein/adaptive_limiter.hpp>
#include <rein/adaptive_rate_limiter.hpp>
#include <rein/admission_throttle.hpp>
#include <rein/algo/adaptive_rate.hpp>
#include <rein/algo/admission_throttle.hpp>
#include <rein/algo/aimd.hpp>
#include <rein/algo/all_of.hpp>
#include <rein/algo/backoff.hpp>
#include <rein/algo/circuit.hpp>
#include <rein/algo/codel.hpp>
#include <rein/algo/fixed_window.hpp>
#include <rein/algo/gradient.hpp>
#include <rein/algo/hedge_delay.hpp>
#include <rein/algo/limit_algorithm.hpp>
#include <rein/algo/log_histogram.hpp>
#include <rein/algo/pacing_margin.hpp>
#include <rein/algo/pid.hpp>
#include <rein/algo/rate_limit.hpp>
#include <rein/algo/retry_budget.hpp>
#include <rein/algo/rolling_quantile.hpp>
#include <rein/algo/sliding_window.hpp>
#include <rein/algo/sliding_window_counter.hpp>
#include <rein/algo/token_bucket.hpp>
#include <rein/algo/tuned_aimd.hpp>
#include <rein/algo/vegas.hpp>
#include <rein/algo/windowed_aimd.hpp>
// Boost.Beast's response reader and request admission: with Boost.Asio only (Beast is part of Boost), when
// Beast is installed.
#if REIN_HAS_BEAST
#include <rein/beast.hpp>
#include <rein/beast/server.hpp>
#include <rein/beast/trusted_proxies.hpp>
#endif
#include <rein/bounded.hpp>
#include <rein/completion_hint.hpp>
#include <rein/error.hpp>
#include <rein/fixed_window.hpp>
#include <rein/hedge.hpp>
#include <rein/keyed.hpp>
#include <rein/lease_view.hpp>
#include <rein/line_options.hpp>
#include <rein/line_view.hpp>
#include <rein/null_mutex.hpp>
#include <rein/observer.hpp>
#include <rein/outcome.hpp>
#include <rein/partition.hpp>
#include <rein/permit.hpp>
#include <rein/queue_order.hpp>
#include <rein/quota.hpp>
#include <rein/quota_gate.hpp>
#include <rein/rate_limit_headers.hpp>
#include <rein/rate_limiter.hpp>
#include <rein/reservation.hpp>
#include <rein/retry.hpp>
#include <rein/retry_after.hpp>
#include <rein/semaphore.hpp>
#include <rein/sliding_window.hpp>
#include <rein/throttle.hpp>
#include <rein/throttle_charge.hpp>
#include <rein/throttle_guard.hpp>
#include <rein/throttle_options.hpp>
#include <rein/throttle_reservation.hpp>
#include <rein/throttle_snapshot.hpp>
#include <rein/token_bucket.hpp>
#include <rein/token_reservation.hpp>
#include <rein/try_result.hpp>
#include <rein/version.hpp>
#include <rein/wait_stats.hpp>
