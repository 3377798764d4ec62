// find_package(kvc_router) consumer. Built against the installed headers, so
// everything included here must have been installed. Besides the umbrella
// header it runs the property kit over an index of its own, as a user who
// plugs in a custom index would.
#include <kvc_router/kvc_router.hpp>
#include <kvc_router/testing/property_kit.hpp>
#include <kvc_router/version.hpp>

#include <cstdio>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

static_assert(__cplusplus >= 202002L,
              "kvc_router::kvc_router must propagate C++20 to consumers");

namespace {

// The consumer's own index: per worker, the set of (session, block) pairs.
class ConsumerIndex {
 public:
  explicit ConsumerIndex(uint32_t workers) : blocks_(workers) {}
  size_t num_workers() const { return blocks_.size(); }
  void Overlap(std::span<const kvc_router::BlockHash> prefix, std::span<uint32_t> out) const {
    for (size_t d = 0; d < blocks_.size(); ++d) {
      uint32_t run = 0;
      while (run < prefix.size() && Holds(d, prefix[run])) ++run;
      out[d] = run;
    }
  }
  void Learn(kvc_router::WorkerId d, kvc_router::SessionId s,
             std::span<const kvc_router::BlockHash> hashes) {
    ForgetSession(d, s);
    for (kvc_router::BlockHash h : hashes) blocks_[d].insert({s, h});
  }
  void ForgetSession(kvc_router::WorkerId d, kvc_router::SessionId s) {
    auto& set = blocks_[d];
    for (auto it = set.begin(); it != set.end();) it = it->first == s ? set.erase(it) : ++it;
  }

 private:
  bool Holds(size_t d, kvc_router::BlockHash h) const {
    for (const auto& entry : blocks_[d]) {
      if (entry.second == h) return true;
    }
    return false;
  }
  std::vector<std::set<std::pair<kvc_router::SessionId, kvc_router::BlockHash>>> blocks_;
};

}  // namespace

int main() {
  std::printf("kvc_router %s (%d.%d.%d) via find_package\n", kvc_router::kVersionString,
              KVC_ROUTER_VERSION_MAJOR, KVC_ROUTER_VERSION_MINOR, KVC_ROUTER_VERSION_PATCH);
  kvc_router::testing::PropertyOptions options;
  options.seed = 7;
  options.scenarios = 300;
  const absl::Status status = kvc_router::testing::CheckAllProperties<ConsumerIndex>(
      [](const kvc_router::RouterConfig& c) { return ConsumerIndex(c.num_decode_workers); },
      options);
  if (!status.ok()) {
    std::printf("property kit failed: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  std::printf("property kit passed over the consumer's index\n");
  return 0;
}
