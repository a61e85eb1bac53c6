// Asio's coroutine frames go through operator new, so that they are counted too (Asio otherwise takes them
// from std::aligned_alloc); this file is its own test binary.
#define BOOST_ASIO_DISABLE_STD_ALIGNED_ALLOC 1
#define BOOST_ASIO_DISABLE_BOOST_ALIGN 1
#define ASIO_DISABLE_STD_ALIGNED_ALLOC 1

// Fast paths that must not allocate: a keyed lookup of a live string key (heterogeneous lookup, no copy of
// the key). Every operator new of the process is counted (support/counting_new.hpp).
#include "support/asio.hpp"
#include "support/catch.hpp"
#include "support/counting_new.hpp"

#include <rein/keyed.hpp>
#include <rein/semaphore.hpp>

#include <cstddef>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace {

namespace net = rein::net;

// Longer than std::string's small buffer (15 characters in libstdc++): a copy of it allocates.
constexpr std::string_view long_host = "api.provider.example.com";

using rein_test::heap::allocations_of;

}  // namespace

TEST_CASE("string keys are looked up as views; other hashes take the key itself", "[keyed][alloc]") {
  STATIC_REQUIRE(std::is_same_v<rein::keyed<rein::semaphore>::key_view, std::string_view>);
  STATIC_REQUIRE(std::is_same_v<rein::keyed<rein::semaphore, std::string, std::mutex, std::hash<std::string>>::key_view,
                                const std::string&>);
  STATIC_REQUIRE(std::is_same_v<rein::keyed<rein::semaphore, int>::key_view, const int&>);
}

TEST_CASE("a live string key is found without allocating, by view, string or literal", "[keyed][alloc]") {
  net::io_context io;
  rein::keyed<rein::semaphore> per_host(io, {}, std::size_t{4});
  per_host.set_override("api.slow-provider.example.com", std::size_t{1});
  const std::string host(long_host);
  auto pin = per_host.get(host);  // made: the key is copied into the registry; pinned, so never evicted
  REQUIRE(pin->snapshot().permits == 4);
  auto slow = per_host.get(std::string_view("api.slow-provider.example.com"));
  REQUIRE(slow->snapshot().permits == 1);  // the override, found by a view

  const long hits = allocations_of([&] {
    for (int i = 0; i < 100; ++i) {
      auto by_view = per_host.get(long_host);
      auto by_string = per_host.get(host);
      auto by_literal = per_host.get("api.provider.example.com");
      rein::error_code ec;
      auto with_code = per_host.get(long_host, ec);
      auto found = per_host.find(long_host);
      if (!by_view || by_view.get() != by_string.get() || by_string.get() != by_literal.get() ||
          with_code.get() != found.get() || ec || !per_host.contains(long_host))
        throw std::logic_error("not the same limiter");
    }
  });
  CHECK(hits == 0);
  CHECK(per_host.snapshot().created_total == 2);
  CHECK(per_host.erase_override("api.slow-provider.example.com"));
  CHECK_FALSE(per_host.erase_override("api.slow-provider.example.com"));

  const long miss = allocations_of([&] { (void)per_host.get("another.provider.example.com"); });
  CHECK(miss >= 1);  // a new key is copied, and its limiter made
  CHECK(per_host.snapshot().created_total == 3);
}
