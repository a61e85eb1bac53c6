// rein::redis::cluster against a real Redis Cluster of six nodes (three masters, three replicas) that the
// test starts on free loopback ports (redis_cluster.hpp): routing by slot, MOVED, ASK during a slot's
// migration, and the failover of a master while limiters use it. Real time with margins.
#include "redis/redis_cluster.hpp"
#include "redis/support.hpp"

#include <rein/error.hpp>
#include <rein/redis/cluster.hpp>
#include <rein/permit.hpp>
#include <rein/redis/shared_quota_gate.hpp>
#include <rein/redis/shared_semaphore.hpp>
#include <rein/redis/shared_sliding_window.hpp>
#include <rein/redis/shared_token_bucket.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace rein_test;
using rein::redis::key_slot;

namespace {

// Short timeouts, so a dead node shows within a test's time.
rein::redis::cluster_options seeded(const std::vector<std::uint16_t>& ports) {
  rein::redis::cluster_options o;
  for (const std::uint16_t port : ports) o.seeds.push_back({"127.0.0.1", port});
  o.connection = local(ports.front());
  return o;
}

rein::redis::reply execute(net::io_context& io, rein::redis::cluster& c, std::string_view key,
                           std::initializer_list<std::string_view> args, rein::error_code* ec_out = nullptr) {
  std::optional<std::pair<rein::error_code, rein::redis::reply>> got;
  c.async_execute(key, args, [&](rein::error_code ec, rein::redis::reply r) { got.emplace(ec, std::move(r)); });
  REQUIRE(run_until(io, [&] { return got.has_value(); }, std::chrono::seconds(5)));
  if (ec_out != nullptr) *ec_out = got->first;
  else REQUIRE_FALSE(got->first);
  return std::move(got->second);
}

// One acquire, run to its end (at most 5 s).
template <class Limiter>
rein::error_code acquire(net::io_context& io, Limiter& limiter, std::chrono::milliseconds timeout) {
  std::optional<rein::error_code> got;
  limiter.async_acquire_for(1, timeout, [&](rein::error_code ec) { got = ec; });
  REQUIRE(run_until(io, [&] { return got.has_value(); }, std::chrono::seconds(5)));
  return *got;
}

// A key whose slot the given master serves (or, with `serves` false, does not serve).
std::string key_on(redis_cluster& nodes, std::uint16_t master, bool serves, const std::string& stem) {
  for (int i = 0;; ++i) {
    std::string key = stem + std::to_string(i);
    if ((nodes.master_of_slot(key_slot(key)) == master) == serves) return key;
  }
}

}  // namespace

TEST_CASE("a cluster client learns the map from one seed, follows MOVED once, then routes by slot") {
  redis_cluster nodes;
  net::io_context io;
  const std::vector<std::uint16_t> masters = nodes.masters();
  REQUIRE(masters.size() == 3);
  // rein's slot function agrees with the server's.
  for (const std::string key : {"foo", "{user1000}.following", "rein:{api}:sem:holders", "quota", "", "foo{}{bar}",
                                 "foo{{bar}}zap", "foo{bar}{zap}", "no}tag{"})
    CHECK(key_slot(key) == nodes.key_slot(key));

  const std::uint16_t seed = masters[0];
  const std::string first = key_on(nodes, seed, false, "first");
  rein::redis::cluster c(io, seeded({seed}));
  // The first command goes to the seed (no map yet), after the request for the map: the map arrives, then
  // the seed's MOVED, which is followed.
  CHECK(execute(io, c, first, {"SET", first, "1"}).text == "OK");
  auto s = c.snapshot();
  CHECK(s.moved == 1);
  CHECK(s.refreshes >= 1);
  CHECK(s.slots_covered == rein::redis::cluster_slot_count);
  CHECK(s.nodes == 3);  // the masters; replicas are not needed
  CHECK(nodes.command(nodes.master_of_slot(key_slot(first)), {"GET", first}) == "1");

  // Keys on every master go straight to it: no more redirections.
  for (int i = 0; i < 24; ++i) {
    const std::string key = "spread" + std::to_string(i);
    CHECK(execute(io, c, key, {"SET", key, std::to_string(i)}).text == "OK");
    CHECK(nodes.command(nodes.master_of_slot(key_slot(key)), {"GET", key}) == std::to_string(i));
  }
  CHECK(c.snapshot().moved == 1);

  // A limiter on the cluster runs its script on its slot's master.
  const std::string name = key_on(nodes, seed, false, "bucket");
  rein::redis::shared_token_bucket bucket(c, {.key = name, .rate = 1, .capacity = 3});
  for (int i = 0; i < 3; ++i) CHECK(acquire(io, bucket, std::chrono::milliseconds(2000)) == rein::error_code{});
  CHECK(acquire(io, bucket, std::chrono::milliseconds(0)) == rein::errc::timed_out);  // 1/s: empty now
  CHECK(nodes.command(nodes.master_of_slot(key_slot(name)), {"EXISTS", name}) == "1");
  CHECK(c.snapshot().moved == 1);
  CHECK(bucket.snapshot().remote_allowed == 3);

  // The shared semaphore's six keys share its slot too: permits are counted on that master.
  const std::string pool = key_on(nodes, seed, false, "pool");
  rein::redis::shared_semaphore sem(c, {.key = pool, .limit = 2});
  std::optional<rein::error_code> done[3];
  rein::permit held[3];
  for (int i = 0; i < 3; ++i)
    sem.async_acquire_for(1, std::chrono::milliseconds(i < 2 ? 2000 : 300), [&, i](rein::error_code ec, rein::permit p) {
      done[i] = ec;
      held[i] = std::move(p);
    });
  REQUIRE(run_until(io, [&] { return done[0] && done[1] && done[2]; }));
  CHECK(*done[0] == rein::error_code{});
  CHECK(*done[1] == rein::error_code{});
  CHECK(*done[2] == rein::errc::timed_out);  // the limit is 2
  const std::string total = "rein:{" + pool + "}:sem:total";
  CHECK(nodes.command(nodes.master_of_slot(key_slot(pool)), {"GET", total}) == "2");
  held[0].release();
  held[1].release();
  CHECK(run_until(io, [&] { return nodes.command(nodes.master_of_slot(key_slot(pool)), {"GET", total}) == "0"; }));
  CHECK(c.snapshot().moved == 1);
}

TEST_CASE("a limiter whose slot is migrating follows ASK to the importing node, then MOVED once it moved") {
  redis_cluster nodes;
  net::io_context io;
  const std::vector<std::uint16_t> masters = nodes.masters();
  const rein::redis::shared_sliding_window_options options{.key = "migrating", .limit = 5, .window = std::chrono::seconds(600)};
  const unsigned slot = key_slot("migrating");
  const std::uint16_t from = nodes.master_of_slot(slot);
  const std::uint16_t to = masters[0] == from ? masters[1] : masters[0];
  rein::redis::cluster c(io, seeded(masters));
  rein::redis::shared_sliding_window window(c, options);
  CHECK(acquire(io, window, std::chrono::milliseconds(2000)) == rein::error_code{});  // on `from`: map learned
  REQUIRE(c.snapshot().asked == 0);
  // Redis runs a multi-key command on a migrating slot only where all its keys are: the window's third key
  // (its stored limit) exists once set_limit stored it.
  REQUIRE(window.set_limit(5));
  REQUIRE(run_until(io, [&] { return nodes.command(from, {"EXISTS", "rein:{migrating}:window:limit"}) == "1"; }));

  nodes.begin_migration(slot, from, to);
  // `from` still has every key of the window: it runs the script itself.
  CHECK(acquire(io, window, std::chrono::milliseconds(2000)) == rein::error_code{});
  CHECK(c.snapshot().asked == 0);
  // Once the keys moved and the slot is `to`'s, `from` answers MOVED.
  nodes.finish_migration(slot, from, to);
  const auto before = c.snapshot();
  CHECK(acquire(io, window, std::chrono::milliseconds(2000)) == rein::error_code{});
  const auto after = c.snapshot();
  CHECK(after.moved == before.moved + 1);  // the stale map sent it to `from`, which answered MOVED
  CHECK(nodes.master_of_slot(slot) == to);
  // The window's admissions moved with its keys: 3 so far, 2 more fit, the sixth does not.
  CHECK(acquire(io, window, std::chrono::milliseconds(2000)) == rein::error_code{});
  CHECK(acquire(io, window, std::chrono::milliseconds(2000)) == rein::error_code{});
  CHECK(acquire(io, window, std::chrono::milliseconds(200)) == rein::errc::timed_out);
  CHECK(c.snapshot().moved == after.moved);

  // A second slot, migrating with none of its keys on either side. A one-key script (the gate's) is asked
  // of the importing node, which runs it. A multi-key script (the window's) gets TRYAGAIN there, because
  // Redis runs no multi-key command on keys it cannot see whole while their slot moves: it fails as
  // unavailable (fail_closed) until the migration ends.
  const unsigned fresh_slot = key_slot("fresh");
  const std::uint16_t owner = nodes.master_of_slot(fresh_slot);
  const std::uint16_t importer = masters[0] == owner ? masters[1] : masters[0];
  nodes.begin_migration(fresh_slot, owner, importer);
  rein::redis::shared_quota_gate gate(c, {.key = "fresh"});
  const auto asked = c.snapshot().asked;
  CHECK(acquire(io, gate, std::chrono::milliseconds(2000)) == rein::error_code{});
  gate.pause_for(std::chrono::seconds(600));  // stored, by way of ASK too
  const auto importer_keys = [&] { return nodes.command(importer, {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(fresh_slot)}); };
  CHECK(run_until(io, [&] { return importer_keys() == "1"; }, std::chrono::seconds(2)));
  CHECK(c.snapshot().asked == asked + 2);
  CHECK(nodes.command(owner, {"CLUSTER", "COUNTKEYSINSLOT", std::to_string(fresh_slot)}) == "0");
  rein::redis::shared_sliding_window both(c, {.key = "fresh", .limit = 2, .window = std::chrono::seconds(600)});
  CHECK(acquire(io, both, std::chrono::milliseconds(2000)) == rein::redis::errc::unavailable);
  CHECK(c.snapshot().asked == asked + 3);
  nodes.finish_migration(fresh_slot, owner, importer);
  run_for(io, std::chrono::milliseconds(150));  // the window's recheck_interval after its failure
  CHECK(acquire(io, both, std::chrono::milliseconds(2000)) == rein::error_code{});
  CHECK(c.snapshot().asked == asked + 3);
  // The pause moved with its key: the gate still holds.
  CHECK(acquire(io, gate, std::chrono::milliseconds(200)) == rein::errc::timed_out);
}

TEST_CASE("a master killed under a limiter: its slot fails closed until a replica takes over, others never stop") {
  redis_cluster nodes;
  net::io_context io;
  const std::vector<std::uint16_t> masters = nodes.masters();
  const std::uint16_t victim = masters[1];
  const std::string doomed = key_on(nodes, victim, true, "doomed");
  const std::string safe = key_on(nodes, victim, false, "safe");
  // The only seed is the master that dies: the client must find the cluster through the nodes it learned.
  rein::redis::cluster c(io, seeded({victim}));
  rein::redis::shared_token_bucket a(c, {.key = doomed, .rate = 10'000, .capacity = 10'000, .recheck_interval = std::chrono::milliseconds(50)});
  rein::redis::shared_token_bucket b(c, {.key = safe, .rate = 10'000, .capacity = 10'000, .recheck_interval = std::chrono::milliseconds(50)});
  REQUIRE(acquire(io, a, std::chrono::milliseconds(2000)) == rein::error_code{});
  REQUIRE(acquire(io, b, std::chrono::milliseconds(2000)) == rein::error_code{});
  // A second client, seeded elsewhere, on the same quota: once the map names the promoted replica, it
  // forgets the dead master (no reconnecting to it forever; `c` keeps trying it: a seed is never forgotten).
  const std::uint16_t other = masters[0];
  rein::redis::cluster c2(io, seeded({other}));
  rein::redis::shared_token_bucket a2(c2, {.key = doomed, .rate = 10'000, .capacity = 10'000, .recheck_interval = std::chrono::milliseconds(50)});
  REQUIRE(acquire(io, a2, std::chrono::milliseconds(2000)) == rein::error_code{});
  CHECK(c2.snapshot().connections == 3);  // the seed (a master) and the two other masters

  nodes.kill(victim);
  const auto killed = steady::now();
  std::size_t a_failed = 0;
  std::size_t b_failed = 0;
  std::optional<steady::time_point> recovered;
  while (!recovered && steady::now() - killed < std::chrono::seconds(30)) {
    const rein::error_code ea = acquire(io, a, std::chrono::milliseconds(500));
    if (!ea) recovered = steady::now();
    else {
      CHECK((ea == rein::redis::errc::unavailable || ea == rein::errc::timed_out));
      ++a_failed;
    }
    if (acquire(io, b, std::chrono::milliseconds(500))) ++b_failed;
    run_for(io, std::chrono::milliseconds(20));
  }
  REQUIRE(recovered.has_value());
  CHECK(a_failed >= 1);  // it did fail closed while its master was gone
  CHECK(b_failed == 0);  // the other masters served throughout
  CHECK(nodes.wait_for_failover(victim, std::chrono::seconds(5)) == nodes.master_of_slot(key_slot(doomed)));
  CHECK(c.snapshot().refreshes >= 2);
  bool second_back = false;
  for (int i = 0; i < 100 && !second_back; ++i) {
    second_back = acquire(io, a2, std::chrono::milliseconds(500)) == rein::error_code{};
    run_for(io, std::chrono::milliseconds(20));
  }
  CHECK(second_back);
  CHECK(c2.snapshot().connections == 3);  // the victim's connection is closed; the promoted replica's is new
  CHECK(c2.snapshot().connected_nodes == 3);
  // Everything works again, on the promoted replica.
  for (int i = 0; i < 20; ++i) CHECK(acquire(io, a, std::chrono::milliseconds(2000)) == rein::error_code{});
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(*recovered - killed).count();
  INFO("failover seen by the client after " << took << " ms");
  std::printf("cluster failover: the limiter admitted again %lld ms after its master was killed\n", static_cast<long long>(took));
  CHECK(*recovered - killed < std::chrono::seconds(15));
}

TEST_CASE("a cluster client seeded with a server without cluster support uses it as the only node") {
  // A misconfiguration that should degrade gracefully: CLUSTER SLOTS fails, and every slot goes to the
  // connected node, through an outage of it too.
  redis_server server;
  net::io_context io;
  rein::redis::cluster c(io, seeded({server.port()}));
  rein::redis::shared_token_bucket bucket(c, {.key = "plain", .rate = 10'000, .capacity = 10'000, .recheck_interval = std::chrono::milliseconds(50)});
  CHECK(acquire(io, bucket, std::chrono::milliseconds(2000)) == rein::error_code{});
  server.kill();
  CHECK(acquire(io, bucket, std::chrono::milliseconds(200)) == rein::redis::errc::unavailable);
  server.start();
  bool back = false;
  for (int i = 0; i < 100 && !back; ++i) {
    back = acquire(io, bucket, std::chrono::milliseconds(200)) == rein::error_code{};
    run_for(io, std::chrono::milliseconds(20));
  }
  CHECK(back);
  const auto s = c.snapshot();
  CHECK(s.refreshes == 0);
  CHECK(s.failed_refreshes >= 1);
  CHECK(s.slots_covered == 0);
}
