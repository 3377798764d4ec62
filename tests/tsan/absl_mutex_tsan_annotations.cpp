// ThreadSanitizer annotations for a NON-instrumented Abseil (Debian's
// libabsl-dev). Linked only into kvc_router's own executables in
// KVC_ROUTER_SANITIZE=tsan builds (target kvc_router_tsan_support).
//
// Why: absl::Mutex::Lock()/Unlock()/ReaderLock()/... live in
// libabsl_synchronization.so. Debian compiles that library without
// -fsanitize=thread, so TSan sees neither the atomics inside it nor the
// __tsan_mutex_* annotations absl only emits when itself built with TSan. Every
// access guarded by an absl::Mutex then looks like a data race (verified on
// Debian 12 / GCC 12: a counter incremented under absl::MutexLock is reported).
//
// How: the executable defines the same member functions, which takes
// precedence over the shared library for calls made from the executable
// (ordinary ELF symbol interposition). Each wrapper tells TSan what is about to
// happen with the same __tsan_mutex_* calls absl's own TSan build uses, then
// forwards to the real implementation found with dlsym(RTLD_NEXT). Reader/writer
// semantics are modelled exactly, so a write under ReaderMutexLock is still
// reported as a race.
//
// Covered: Lock, Unlock, TryLock, ReaderLock, ReaderUnlock, ReaderTryLock and
// ~Mutex, i.e. absl::MutexLock, absl::ReaderMutexLock, absl::WriterMutexLock
// and absl::ReleasableMutexLock.
// NOT covered: Mutex::Await / LockWhen* / ReaderLockWhen* / absl::Condition,
// absl::CondVar, absl::Notification, absl::Barrier, absl::BlockingCounter.
// Under TSan these still produce false reports; use std:: primitives
// (std::latch, std::barrier, std::condition_variable, atomics) in code that
// must run under TSan, or extend this file.
#include "absl/base/config.h"

#if defined(ABSL_HAVE_THREAD_SANITIZER)

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"

namespace {

#define KVC_ROUTER_TSAN_STR2(x) #x
#define KVC_ROUTER_TSAN_STR(x) KVC_ROUTER_TSAN_STR2(x)

// Itanium mangling of absl::<inline ns>::Mutex::<member>.
std::string MangledMutexMember(const char* member) {
#if ABSL_OPTION_USE_INLINE_NAMESPACE
  const std::string ns = KVC_ROUTER_TSAN_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return "_ZN4absl" + std::to_string(ns.size()) + ns + "5Mutex" + member;
#else
  return std::string("_ZN4absl5Mutex") + member;
#endif
}

template <typename Fn>
Fn RealMutexMember(const char* member) {
  const std::string name = MangledMutexMember(member);
  void* sym = dlsym(RTLD_NEXT, name.c_str());
  if (sym == nullptr) {
    std::fprintf(stderr, "kvc_router tsan support: cannot resolve %s: %s\n", name.c_str(),
                 dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(sym);
}

using VoidMember = void (*)(absl::Mutex*);
using BoolMember = bool (*)(absl::Mutex*);

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static const VoidMember real = RealMutexMember<VoidMember>("4LockEv");
  __tsan_mutex_pre_lock(this, 0);
  real(this);
  __tsan_mutex_post_lock(this, 0, 0);
}

void Mutex::Unlock() {
  static const VoidMember real = RealMutexMember<VoidMember>("6UnlockEv");
  __tsan_mutex_pre_unlock(this, 0);
  real(this);
  __tsan_mutex_post_unlock(this, 0);
}

bool Mutex::TryLock() {
  static const BoolMember real = RealMutexMember<BoolMember>("7TryLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_try_lock);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_try_lock | (locked ? 0 : __tsan_mutex_try_lock_failed),
                         0);
  return locked;
}

void Mutex::ReaderLock() {
  static const VoidMember real = RealMutexMember<VoidMember>("10ReaderLockEv");
  __tsan_mutex_pre_lock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_lock(this, __tsan_mutex_read_lock, 0);
}

void Mutex::ReaderUnlock() {
  static const VoidMember real = RealMutexMember<VoidMember>("12ReaderUnlockEv");
  __tsan_mutex_pre_unlock(this, __tsan_mutex_read_lock);
  real(this);
  __tsan_mutex_post_unlock(this, __tsan_mutex_read_lock);
}

bool Mutex::ReaderTryLock() {
  static const BoolMember real = RealMutexMember<BoolMember>("13ReaderTryLockEv");
  constexpr unsigned kFlags = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(this, kFlags);
  const bool locked = real(this);
  __tsan_mutex_post_lock(this, kFlags | (locked ? 0 : __tsan_mutex_try_lock_failed), 0);
  return locked;
}

Mutex::~Mutex() {
  static const VoidMember real = RealMutexMember<VoidMember>("D1Ev");
  __tsan_mutex_destroy(this, __tsan_mutex_not_static);
  real(this);
}

ABSL_NAMESPACE_END
}  // namespace absl

#endif  // ABSL_HAVE_THREAD_SANITIZER
