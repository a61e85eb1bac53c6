// detail::permit_pool, the word a thread-safe semaphore's uncontended calls go through: exact contents after
// each step, and each bound at which it hands a call to the locked line. The line around it is checked in
// tests/async/semaphore.cpp (every sequence of calls against a model) and semaphore_stress.cpp (threads).
#include <rein/detail/permit_pool.hpp>

#include "support/catch.hpp"

#include <cstddef>
#include <cstdint>

using rein::detail::permit_pool;

TEST_CASE("a closed word serves nothing; reclaiming it yields nothing", "[permit_pool]") {
  permit_pool pool;
  CHECK_FALSE(pool.is_open());
  CHECK_FALSE(pool.try_take(0));
  CHECK_FALSE(pool.try_give(1));
  const permit_pool::taken t = pool.reclaim();
  CHECK(t.units == 0);
  CHECK(t.acquires == 0);
  CHECK(t.holders == 0);
}

TEST_CASE("takes and gives through an open word come back exactly at the reclaim", "[permit_pool]") {
  permit_pool pool;
  pool.open(5);
  CHECK(pool.is_open());
  CHECK(pool.try_take(2));
  CHECK(pool.try_take(3));
  CHECK_FALSE(pool.try_take(1));  // no unit left: the locked line decides
  CHECK(pool.try_give(2));
  CHECK(pool.try_take(0));        // a request for nothing is a permit like any other
  const permit_pool::taken t = pool.reclaim();
  CHECK(t.units == 2);
  CHECK(t.acquires == 3);
  CHECK(t.holders == 2);          // three taken, one given back
  CHECK_FALSE(pool.is_open());
  CHECK_FALSE(pool.try_give(1));  // closed by the reclaim
}

TEST_CASE("permits taken under the lock may come back through the word: holders go below zero", "[permit_pool]") {
  permit_pool pool;
  pool.open(0);
  CHECK(pool.try_give(4));
  CHECK(pool.try_give(1));
  const permit_pool::taken t = pool.reclaim();
  CHECK(t.units == 5);
  CHECK(t.acquires == 0);
  CHECK(t.holders == -2);
}

TEST_CASE("the word refuses at each counter's bound and the reclaim folds the counts", "[permit_pool]") {
  SECTION("acquires: 65,535 takes, then the lock") {
    permit_pool pool;
    pool.open(permit_pool::max_units);
    for (int i = 0; i < 65535; ++i) {
      REQUIRE(pool.try_take(0));
      REQUIRE(pool.try_give(0));
    }
    CHECK_FALSE(pool.try_take(0));
    CHECK(pool.try_give(0));  // a give does not count acquires
    const permit_pool::taken t = pool.reclaim();
    CHECK(t.acquires == 65535);
    CHECK(t.holders == -1);
    CHECK(t.units == permit_pool::max_units);
  }
  SECTION("holders: 32,767 more out, then the lock") {
    permit_pool pool;
    pool.open(40000);
    for (int i = 0; i < 32767; ++i) REQUIRE(pool.try_take(1));
    CHECK_FALSE(pool.try_take(1));
    const permit_pool::taken t = pool.reclaim();
    CHECK(t.holders == 32767);
    CHECK(t.acquires == 32767);
    CHECK(t.units == 40000 - 32767);
  }
  SECTION("holders: 32,768 more back, then the lock") {
    permit_pool pool;
    pool.open(0);
    for (int i = 0; i < 32768; ++i) REQUIRE(pool.try_give(1));
    CHECK_FALSE(pool.try_give(1));
    const permit_pool::taken t = pool.reclaim();
    CHECK(t.holders == -32768);
    CHECK(t.units == 32768);
  }
  SECTION("units: never above max_units, and a request above it is the lock's") {
    permit_pool pool;
    pool.open(permit_pool::max_units - 1);
    CHECK_FALSE(pool.try_give(2));
    CHECK(pool.try_give(1));
    CHECK(pool.try_give(0));  // a give of nothing fits
    CHECK_FALSE(pool.try_take(static_cast<std::size_t>(permit_pool::max_units) + 1));
    const permit_pool::taken t = pool.reclaim();
    CHECK(t.units == permit_pool::max_units);
    CHECK(t.holders == -2);
  }
}
