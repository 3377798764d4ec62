// find_package(kvc_router) consumer. Built against the installed headers, so
// everything included here must have been installed.
#include <kvc_router/kvc_router.hpp>
#include <kvc_router/version.hpp>

#include <cstdio>

static_assert(__cplusplus >= 202002L,
              "kvc_router::kvc_router must propagate C++20 to consumers");

int main() {
  std::printf("kvc_router %s (%d.%d.%d) via find_package\n", kvc_router::kVersionString,
              KVC_ROUTER_VERSION_MAJOR, KVC_ROUTER_VERSION_MINOR, KVC_ROUTER_VERSION_PATCH);
  return 0;
}
