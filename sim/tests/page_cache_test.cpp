// Tests of the page-granular LRU prefix cache (kvc_sim/page_cache.hpp):
// leading-run matches, pins, least-recently-used leaf-first eviction, the
// reservation bound, tails of kept contexts and the host tier.
#include "kvc_sim/page_cache.hpp"

#include <catch2/catch.hpp>
#include <vector>

#include "kvc_router/detail/splitmix.hpp"
#include "test_support.hpp"

namespace kvc_router::sim {
namespace {

constexpr uint32_t kBlock = 10;

TEST_CASE("page cache: a kept chain is found as a leading run", "[sim][page-cache]") {
  PageCache cache(1000, kBlock, true, {});
  const std::vector<BlockHash> a = test::TestChain(8, 1);
  PageCache::Lease lease;
  PageCache::Match m = cache.Lookup(a);
  CHECK(m.gpu_blocks == 0);
  REQUIRE(cache.Reserve(lease, a, m, 85));
  CHECK(cache.used_tokens() == 85);
  cache.Release(lease, a, 85);
  CHECK(cache.cached_tokens() == 80);
  CHECK(cache.used_tokens() == 80);
  // A request continuing a's context reuses its 8 pages and the 5-token tail.
  std::vector<BlockHash> longer = a;
  const std::vector<BlockHash> more = test::TestChain(3, 2, a.back());
  longer.insert(longer.end(), more.begin(), more.end());
  m = cache.Lookup(longer, 85);
  CHECK(m.gpu_blocks == 8);
  CHECK(m.tail_tokens == 5);
  // A different continuation of the same first 4 pages reuses only those.
  std::vector<BlockHash> branch(a.begin(), a.begin() + 4);
  const std::vector<BlockHash> other = test::TestChain(4, 3, a[3]);
  branch.insert(branch.end(), other.begin(), other.end());
  m = cache.Lookup(branch, 0);
  CHECK(m.gpu_blocks == 4);
  CHECK(m.tail_tokens == 0);
}

TEST_CASE("page cache: least recently used pages go first, pinned pages never",
          "[sim][page-cache]") {
  PageCache cache(100, kBlock, true, {});
  const std::vector<BlockHash> a = test::TestChain(5, 1);
  const std::vector<BlockHash> b = test::TestChain(5, 2);
  PageCache::Lease la, lb;
  REQUIRE(cache.Reserve(la, a, cache.Lookup(a), 50));
  cache.Release(la, a, 50);
  REQUIRE(cache.Reserve(lb, b, cache.Lookup(b), 50));
  cache.Release(lb, b, 50);
  CHECK(cache.cached_tokens() == 100);
  // Touch a again (pinned while it runs), then ask for 30 more tokens: only
  // b's deepest pages may go.
  PageCache::Lease again;
  PageCache::Match ma = cache.Lookup(a);
  REQUIRE(ma.gpu_blocks == 5);
  REQUIRE(cache.Reserve(again, a, ma, 80));
  CHECK(cache.Lookup(a).gpu_blocks == 5);
  CHECK(cache.Lookup(b).gpu_blocks == 2);  // leaves first: b keeps its first 2 pages
  CHECK(cache.used_tokens() <= cache.capacity_tokens());
  // Nothing can make room for more than what is unpinned.
  PageCache::Lease too_big;
  const std::vector<BlockHash> c = test::TestChain(9, 3);
  CHECK_FALSE(cache.Reserve(too_big, c, cache.Lookup(c), 90));
  CHECK(cache.Lookup(b).gpu_blocks == 2);  // a refused reservation changes nothing
  cache.Release(again, a, 80);
  CHECK(cache.used_tokens() <= cache.capacity_tokens());
  // A footprint above the capacity never fits.
  CHECK_FALSE(cache.Reserve(too_big, c, cache.Lookup(c), 101));
}

TEST_CASE("page cache: a closed session's own pages go first, shared ones stay",
          "[sim][page-cache]") {
  // a (owner 1) and then b (owner 2) keep 4 pages each; b shares a's first
  // two (a system prompt), so those were last kept by b.
  const std::vector<BlockHash> a = test::TestChain(4, 1);
  std::vector<BlockHash> b(a.begin(), a.begin() + 2);
  const std::vector<BlockHash> b_own = test::TestChain(2, 2, a[1]);
  b.insert(b.end(), b_own.begin(), b_own.end());
  // After a (owner 1) and b (owner 2) were kept, `close_owner` closes
  // `closed` (none when 0), then a third context of `pages` pages (owner 3)
  // needs room. Returns the pages of a and b still found, and the host tier.
  struct After {
    uint32_t a_pages, b_pages;
    uint64_t host_tokens;
  };
  auto run = [&](const std::vector<BlockHash>& closed, uint64_t close_owner, size_t pages,
                 uint64_t host_tokens = 0) {
    HostTierConfig host;
    host.capacity_tokens = host_tokens;
    PageCache cache(100, kBlock, true, host);
    auto keep = [&cache](const std::vector<BlockHash>& chain, uint64_t owner) {
      PageCache::Lease lease;
      const uint64_t tokens = chain.size() * kBlock;
      REQUIRE(cache.Reserve(lease, chain, cache.Lookup(chain), tokens));
      cache.Release(lease, chain, tokens, owner);
    };
    keep(a, 1);
    keep(b, 2);
    REQUIRE(cache.cached_tokens() == 60);  // 6 distinct pages of 10
    if (close_owner != 0) cache.Close(closed, close_owner);
    keep(test::TestChain(pages, 3), 3);
    return After{cache.Lookup(a).gpu_blocks, cache.Lookup(b).gpu_blocks, cache.host_tokens()};
  };
  struct Case {
    const char* what;
    const std::vector<BlockHash>* closed;
    uint64_t close_owner;
    size_t pages;
    uint32_t a_pages, b_pages;
  };
  const Case cases[] = {
      // 2 pages must go.
      {"no close: LRU takes a's own pages, the oldest", &b, 0, 6, 2, 4},
      {"closing b, the younger, makes its own pages go instead", &b, 2, 6, 4, 2},
      {"a close by another owner moves nothing", &b, 7, 6, 2, 4},
      // 4 pages must go: the closed session's own two, then the other's own
      // two (the oldest, or the deepest); the shared prefix stays.
      {"closing b leaves the pages a kept too", &b, 2, 8, 2, 2},
      {"closing a leaves the pages b kept since", &a, 1, 8, 2, 2},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const After after = run(*c.closed, c.close_owner, c.pages);
    CHECK(after.a_pages == c.a_pages);
    CHECK(after.b_pages == c.b_pages);
  }
  // Closed pages are not spilled to a host tier.
  CHECK(run(b, 0, 6, 1000).host_tokens == 20);  // a's own two pages spilled
  CHECK(run(b, 2, 6, 1000).host_tokens == 0);   // b's own two went for good
}

TEST_CASE("page cache: random workloads never exceed the capacity and stay prefix-closed",
          "[sim][page-cache][property]") {
  const uint64_t seed = GENERATE(take(20, random(uint64_t{1}, uint64_t{1} << 40)));
  INFO("seed " << seed);
  kvc_router::detail::SplitMix64 rng(seed);
  const uint64_t capacity = 50 + rng.Next() % 400;
  const uint64_t host_capacity = rng.Next() % 300;
  PageCache cache(capacity, kBlock, true,
                  {.capacity_tokens = host_capacity, .reload_bytes_per_s = 1e9});
  std::vector<std::vector<BlockHash>> chains;
  for (int i = 0; i < 12; ++i) chains.push_back(test::TestChain(1 + rng.Next() % 30, 100 + i));
  std::vector<std::pair<PageCache::Lease, size_t>> running;
  for (int step = 0; step < 400; ++step) {
    if (!running.empty() && (rng.Next() % 2 == 0 || running.size() > 4)) {
      const size_t k = rng.Next() % running.size();
      auto& [lease, c] = running[k];
      const size_t keep = rng.Next() % (chains[c].size() + 1);
      cache.Release(lease, std::span<const BlockHash>(chains[c]).first(keep), keep * kBlock);
      running.erase(running.begin() + static_cast<ptrdiff_t>(k));
    } else {
      const size_t c = rng.Next() % chains.size();
      const PageCache::Match m = cache.Lookup(chains[c]);
      PageCache::Lease lease;
      if (cache.Reserve(lease, chains[c], m, chains[c].size() * kBlock)) running.emplace_back(lease, c);
    }
    REQUIRE(cache.used_tokens() <= capacity);
    REQUIRE(cache.host_tokens() <= host_capacity);
    // Prefix-closed, as a radix tree: a cached page's parent is cached.
    for (const auto& chain : chains) {
      const uint32_t run = cache.Lookup(chain).gpu_blocks;
      for (size_t i = run; i < chain.size(); ++i) {
        INFO("step " << step << " page " << i << " of a chain cached up to " << run);
        REQUIRE_FALSE(cache.Contains(chain[i]));
      }
    }
  }
}

TEST_CASE("page cache: evicted pages spill to the host tier and are found there",
          "[sim][page-cache][host-tier]") {
  PageCache cache(50, kBlock, true, {.capacity_tokens = 1000, .reload_bytes_per_s = 1e9});
  const std::vector<BlockHash> a = test::TestChain(5, 1);
  const std::vector<BlockHash> b = test::TestChain(5, 2);
  PageCache::Lease l;
  REQUIRE(cache.Reserve(l, a, cache.Lookup(a), 50));
  cache.Release(l, a, 50);
  REQUIRE(cache.Reserve(l, b, cache.Lookup(b), 50));  // evicts all of a
  cache.Release(l, b, 50);
  const PageCache::Match m = cache.Lookup(a);
  CHECK(m.gpu_blocks == 0);
  CHECK(m.host_blocks == 5);
  CHECK(cache.host_tokens() == 50);
  PageCache no_host(50, kBlock, true, {});
  REQUIRE(no_host.Reserve(l, a, no_host.Lookup(a), 50));
  no_host.Release(l, a, 50);
  REQUIRE(no_host.Reserve(l, b, no_host.Lookup(b), 50));
  no_host.Release(l, b, 50);
  CHECK(no_host.Lookup(a).host_blocks == 0);
  PageCache disabled(50, kBlock, false, {});
  REQUIRE(disabled.Reserve(l, a, disabled.Lookup(a), 50));
  disabled.Release(l, a, 50);
  CHECK(disabled.Lookup(a).gpu_blocks == 0);
  CHECK(disabled.used_tokens() == 0);
}


TEST_CASE("page cache: a backed-up chain is cached as far as room allows, never beyond",
          "[sim][page-cache][backup]") {
  PageCache cache(100, kBlock, true, {});
  const std::vector<BlockHash> a = test::TestChain(6, 1);
  // A running request pins 5 pages (50 tokens).
  const std::vector<BlockHash> b = test::TestChain(5, 2);
  PageCache::Lease lease;
  REQUIRE(cache.Reserve(lease, b, cache.Lookup(b), 50));
  cache.Publish(lease, b, 50);
  // Room for 5 of a's 6 pages: the leading 5 go in, the last does not.
  CHECK(cache.Insert(a, 63, 7) == 5);
  CHECK(cache.Lookup(a, 63, 7).gpu_blocks == 5);
  CHECK(cache.Lookup(a, 63, 7).tail_tokens == 0);  // the tail needs the whole chain
  CHECK(cache.used_tokens() <= cache.capacity_tokens());
  // The running request's pages were not touched.
  CHECK(cache.Lookup(b).gpu_blocks == 5);
  // Once it is gone, the whole chain and its tail fit.
  cache.Release(lease, {});
  CHECK(cache.Insert(a, 63, 7) == 6);
  const PageCache::Match m = cache.Lookup(a, 63, 7);
  CHECK(m.gpu_blocks == 6);
  CHECK(m.tail_tokens == 3);
  // Another owner's request finds the pages but not the tail.
  CHECK(cache.Lookup(a, 63, 8).tail_tokens == 0);
  // A chain that diverges after block 2 reuses exactly the 3 shared blocks.
  std::vector<BlockHash> fork(a.begin(), a.begin() + 3);
  const std::vector<BlockHash> rest = test::TestChain(4, 9, fork.back());
  fork.insert(fork.end(), rest.begin(), rest.end());
  CHECK(cache.Lookup(fork).gpu_blocks == 3);
}

TEST_CASE("page cache: demoted pages are evicted first", "[sim][page-cache][migration]") {
  PageCache cache(60, kBlock, true, {});
  const std::vector<BlockHash> old = test::TestChain(3, 1);
  const std::vector<BlockHash> moved = test::TestChain(3, 2);
  CHECK(cache.Insert(old, 30) == 3);
  CHECK(cache.Insert(moved, 30) == 3);  // younger than `old`
  cache.Demote(moved);
  // Room for 30 more tokens: the demoted chain goes, the older one stays.
  const std::vector<BlockHash> fresh = test::TestChain(3, 3);
  CHECK(cache.Insert(fresh, 30) == 3);
  CHECK(cache.Lookup(old).gpu_blocks == 3);
  CHECK(cache.Lookup(moved).gpu_blocks == 0);
}

}  // namespace
}  // namespace kvc_router::sim
