// The pure sojourn rule (CoDel as a request queue runs it): when a line is judged to stand, which waiters are
// shed, and when it stops standing. Every instant is given; target 10 ms (slough time 20 ms), interval 100 ms.
#include <rein/algo/codel.hpp>

#include <chrono>
#include <stdexcept>
#include <string>

#include "support/catch.hpp"

using namespace std::chrono_literals;
using rein::algo::codel;
using rein::algo::codel_options;
using std::chrono::nanoseconds;

namespace {

using time_point = codel::time_point;
time_point at(nanoseconds d) { return time_point(d); }

codel ten_ms() { return codel(codel_options{.target = 10ms, .interval = 100ms}); }

// What a line does with its next waiter: sheds it, or grants it (and the rule learns its queueing time).
bool grant_or_shed(codel& rule, time_point arrived, time_point now) {
  if (rule.should_shed(arrived, now)) return true;
  rule.granted(arrived, now);
  return false;
}

// Grants one waiter every 10 ms in [from, to), each having queued `waited`; returns how many were shed.
int grant_every_10ms(codel& rule, nanoseconds from, nanoseconds to, nanoseconds waited) {
  int shed = 0;
  for (nanoseconds t = from; t < to; t += 10ms) shed += grant_or_shed(rule, at(t - waited), at(t)) ? 1 : 0;
  return shed;
}

}  // namespace

TEST_CASE("off by default: nothing is judged or shed", "[codel]") {
  codel rule;
  CHECK_FALSE(rule.enabled());
  for (int i = 0; i < 100; ++i) CHECK_FALSE(grant_or_shed(rule, at(0s), at(std::chrono::seconds(i))));
  CHECK_FALSE(rule.standing());
  CHECK(rule.standing_intervals() == 0);
}

TEST_CASE("a queue standing for a whole interval sheds waiters past twice the target", "[codel]") {
  codel rule = ten_ms();
  rule.empty_at(at(0ms));  // the first waiter joins an empty line: the first interval drained
  CHECK(grant_every_10ms(rule, 10ms, 100ms, 30ms) == 0);
  CHECK_FALSE(rule.standing());
  // At 100 ms the first interval closes: it emptied, so the line does not stand, and [100, 200) begins.
  CHECK(grant_every_10ms(rule, 100ms, 200ms, 30ms) == 0);
  CHECK_FALSE(rule.standing());
  // At 200 ms: [100, 200) never emptied and its shortest wait, 30 ms, exceeded the target: it stands.
  CHECK(grant_or_shed(rule, at(200ms - 21ms), at(200ms)));  // past the slough time, 20 ms
  CHECK(rule.standing());
  CHECK(rule.standing_intervals() == 1);
  CHECK_FALSE(grant_or_shed(rule, at(201ms - 20ms), at(201ms)));  // exactly 2 x target: granted
  CHECK_FALSE(grant_or_shed(rule, at(202ms - 11ms), at(202ms)));
}

TEST_CASE("the line stops standing after an interval with a grant within the target", "[codel]") {
  codel rule = ten_ms();
  CHECK(grant_every_10ms(rule, 0ms, 100ms, 30ms) == 0);  // no emptying: [0, 100) stands
  CHECK(grant_or_shed(rule, at(100ms - 25ms), at(100ms)));
  CHECK(rule.standing());
  CHECK(grant_every_10ms(rule, 110ms, 190ms, 15ms) == 0);  // within the slough time: granted
  CHECK_FALSE(grant_or_shed(rule, at(195ms - 10ms), at(195ms)));    // exactly the target: [100, 200) is clean
  CHECK(grant_or_shed(rule, at(199ms - 30ms), at(199ms)));           // still standing until the interval ends
  CHECK_FALSE(grant_or_shed(rule, at(200ms - 30ms), at(200ms)));     // judged at 200 ms: no longer standing
  CHECK_FALSE(rule.standing());
  CHECK(rule.standing_intervals() == 1);
}

TEST_CASE("a burst that drains within the interval is never shed, however deep", "[codel]") {
  codel rule = ten_ms();
  for (int burst = 0; burst < 5; ++burst) {
    const nanoseconds start = burst * 100ms;
    rule.empty_at(at(start));
    // 9 waiters joined at `start` and are granted 10 ms apart, the last after 90 ms: then the line empties.
    for (nanoseconds t = start + 10ms; t < start + 100ms; t += 10ms) CHECK_FALSE(grant_or_shed(rule, at(start), at(t)));
  }
  CHECK(rule.standing_intervals() == 0);
}

TEST_CASE("a line that grants nothing for longer than an interval, never emptying, stands", "[codel]") {
  codel rule = ten_ms();
  CHECK_FALSE(grant_or_shed(rule, at(0ms - 15ms), at(0ms)));  // starts the interval
  // Nothing is granted until 350 ms (every permit held): [0, 350) closes then, stood, and the head is old.
  CHECK(grant_or_shed(rule, at(10ms), at(350ms)));
  CHECK(rule.standing());
  CHECK_FALSE(grant_or_shed(rule, at(340ms), at(350ms)));
}

TEST_CASE("intervals start at the first event after the last one's end; an idle line counts none", "[codel]") {
  codel rule = ten_ms();
  CHECK_FALSE(grant_or_shed(rule, at(0ms - 50ms), at(0ms)));
  // Next event at 10 s: [0, 10 s) closes with its one grant (50 ms > target), never emptied: it stands.
  CHECK(grant_or_shed(rule, at(10s - 50ms), at(10s)));
  CHECK(rule.standing_intervals() == 1);
  rule.empty_at(at(10s + 1ms));
  CHECK(grant_or_shed(rule, at(10s + 99ms - 50ms), at(10s + 99ms)));  // [10 s, 10.1 s) is in force: still standing
  CHECK_FALSE(grant_or_shed(rule, at(10s + 100ms - 50ms), at(10s + 100ms)));  // it emptied: no longer
}

TEST_CASE("time going back closes no interval and measures waits as given; extreme readings are safe",
          "[codel]") {
  codel rule = ten_ms();
  CHECK(grant_every_10ms(rule, 1s, 1100ms, 30ms) == 0);
  CHECK(grant_or_shed(rule, at(1s), at(1100ms)));  // stands at 1.1 s (the head waited 100 ms)
  // The clock set back to 500 ms: still standing, and a wait is what the readings say.
  CHECK(rule.should_shed(at(400ms), at(500ms)));
  CHECK_FALSE(rule.should_shed(at(490ms), at(500ms)));
  CHECK(rule.standing());
  CHECK_FALSE(grant_or_shed(rule, at(1100ms), at(0ms)));  // arrived "after" now: waited 0
  CHECK(grant_or_shed(rule, time_point::min(), at(1100ms)));  // waited saturates at nanoseconds::max()
  // The reading 0 above made [1.1 s, ...) clean: max() closes it, no longer standing.
  CHECK_FALSE(grant_or_shed(rule, time_point::max(), time_point::max()));
  CHECK_FALSE(grant_or_shed(rule, time_point::min(), time_point::max()));
  CHECK(rule.standing_intervals() == 1);
}

TEST_CASE("invalid options name the type, field and value", "[codel]") {
  const auto message = [](const codel_options& o) {
    try {
      codel rule(o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(message({.target = -1ns, .interval = 100ms}) == "rein::algo::codel: sojourn.target must be >= 0, got -1 ns");
  CHECK(message({.target = 1ms, .interval = 0ns}) == "rein::algo::codel: sojourn.interval must be > 0, got 0 ns");
  CHECK(message({.target = nanoseconds::max(), .interval = 1s}) ==
        "rein::algo::codel: sojourn.target must be at most nanoseconds::max() / 2, got 9223372036854775807 ns");
  CHECK(message({.target = 0ns, .interval = 0ns}).empty());  // off: the interval is not read
  CHECK_THROWS_AS(codel(codel_options{.target = 1ms, .interval = -1s}, "rein::semaphore"), std::invalid_argument);
}

TEST_CASE("asking about a waiting one learns nothing; the line wakes at the slough time and interval end",
          "[codel]") {
  codel rule = ten_ms();
  CHECK(rule.interval_end() == time_point::max());  // nothing seen yet
  CHECK(grant_or_shed(rule, at(-30ms), at(0ms)) == false);
  CHECK(rule.interval_end() == at(100ms));
  // A waiter that joined at 95 ms is looked at while waiting (5 ms): that is no grant within the target.
  CHECK_FALSE(rule.should_shed(at(95ms), at(100ms) - 1ns));
  CHECK(rule.should_shed(at(0ms), at(100ms)));  // the interval's one grant waited 30 ms: it stands
  CHECK(rule.interval_end() == at(200ms));
  CHECK(rule.slough_at(at(95ms)) == at(115ms) + 1ns);  // first instant past 2 x target
  CHECK_FALSE(rule.should_shed(at(95ms), at(115ms)));
  CHECK(rule.should_shed(at(95ms), at(115ms) + 1ns));
  CHECK(rule.slough_at(time_point::max() - 1ns) == time_point::max());
}
