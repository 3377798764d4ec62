// add_subdirectory(kvc_router) consumer.
#include <kvc_router/kvc_router.hpp>
#include <kvc_router/version.hpp>

#include <cstdio>

static_assert(__cplusplus >= 202002L,
              "kvc_router::kvc_router must propagate C++20 to consumers");

int main() {
  std::printf("kvc_router %s via add_subdirectory\n", kvc_router::kVersionString);
  return 0;
}
