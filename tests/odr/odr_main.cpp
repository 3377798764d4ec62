// ODR check driver: see odr_a.cpp. Linking succeeded if this runs at all.
#include <cstdio>

int OdrA();
int OdrB();
const void* OdrAddressA();
const void* OdrAddressB();

int main() {
  int failures = 0;
  if (OdrA() != OdrB()) {
    std::fprintf(stderr, "ODR: OdrA()=%d != OdrB()=%d\n", OdrA(), OdrB());
    ++failures;
  }
  if (OdrAddressA() != OdrAddressB()) {
    std::fprintf(stderr, "ODR: inline variable has two addresses (%p vs %p)\n",
                 OdrAddressA(), OdrAddressB());
    ++failures;
  }
  if (failures == 0) std::printf("ODR check passed\n");
  return failures == 0 ? 0 : 1;
}
