// What the rein::redis::shared_semaphore tests against a real server share: an acquire's outcome with its
// permit, and the key of the count Redis keeps.
#pragma once

#include "support.hpp"

#include <rein/permit.hpp>
#include <rein/redis/shared_semaphore.hpp>

#include <optional>
#include <string>
#include <utility>

namespace rein_test {

/// One acquire's outcome, with its permit.
struct taken {
  std::optional<rein::error_code> ec;
  rein::permit permit;
  steady::time_point start = steady::now();
  steady::time_point at;
};

/// The handler of an acquire that records into `t`.
inline auto into(taken& t) {
  return [&t](rein::error_code ec, rein::permit p) {
    t.ec = ec;
    t.permit = std::move(p);
    t.at = steady::now();
  };
}

/// The key holding the permits Redis counts for the semaphore of `o`.
inline std::string total_key(const rein::redis::shared_semaphore_options& o) { return "rein:{" + o.key + "}:sem:total"; }

}  // namespace rein_test
