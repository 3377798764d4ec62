# Warning, -Werror and sanitizer settings for kvc_router's OWN targets (tests,
# examples, benchmarks, header check, ODR test). Nothing here is attached to
# the kvc_router INTERFACE target, so consumers never inherit these flags.
#
# Inputs (cache variables from the top-level CMakeLists.txt):
#   KVC_ROUTER_WERROR    ON  -> -Werror on top of -Wall -Wextra -Wpedantic
#   KVC_ROUTER_SANITIZE  ""                  -> none
#                        asan | address | address;undefined | address,undefined
#                                            -> -fsanitize=address,undefined
#                        tsan | thread       -> -fsanitize=thread
#                        ubsan | undefined   -> -fsanitize=undefined
# Outputs (normal variables, visible in all subdirectories):
#   KVC_ROUTER_SANITIZE_KIND   "", "asan", "tsan" or "ubsan"
#   KVC_ROUTER_SANITIZE_FLAGS  compile+link flags for that sanitizer
include_guard(GLOBAL)

string(TOLOWER "${KVC_ROUTER_SANITIZE}" _kvc_san)
string(REPLACE "," ";" _kvc_san "${_kvc_san}")
list(REMOVE_DUPLICATES _kvc_san)
list(SORT _kvc_san)
if(_kvc_san STREQUAL "" OR _kvc_san STREQUAL "none" OR _kvc_san STREQUAL "off")
  set(KVC_ROUTER_SANITIZE_KIND "")
  set(KVC_ROUTER_SANITIZE_FLAGS "")
elseif(_kvc_san STREQUAL "asan" OR _kvc_san STREQUAL "address"
       OR _kvc_san STREQUAL "address;undefined" OR _kvc_san STREQUAL "asan;ubsan")
  set(KVC_ROUTER_SANITIZE_KIND "asan")
  set(KVC_ROUTER_SANITIZE_FLAGS
      -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
elseif(_kvc_san STREQUAL "tsan" OR _kvc_san STREQUAL "thread")
  set(KVC_ROUTER_SANITIZE_KIND "tsan")
  set(KVC_ROUTER_SANITIZE_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
elseif(_kvc_san STREQUAL "ubsan" OR _kvc_san STREQUAL "undefined")
  set(KVC_ROUTER_SANITIZE_KIND "ubsan")
  set(KVC_ROUTER_SANITIZE_FLAGS
      -fsanitize=undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
else()
  message(FATAL_ERROR
    "kvc_router: unsupported KVC_ROUTER_SANITIZE='${KVC_ROUTER_SANITIZE}'. "
    "Use '', 'asan' (address+undefined), 'tsan' or 'ubsan'.")
endif()
unset(_kvc_san)

if(KVC_ROUTER_SANITIZE_KIND AND MSVC)
  message(FATAL_ERROR "kvc_router: KVC_ROUTER_SANITIZE is only supported with GCC/Clang")
endif()

# kvc_router_target_options(<target> [NO_WERROR])
#   Applies warnings (+ -Werror if KVC_ROUTER_WERROR, unless NO_WERROR) and the
#   selected sanitizer to compile and link of <target>. For executables in TSan
#   builds it also links kvc_router_tsan_support (Abseil Mutex annotations, see
#   tests/tsan/absl_mutex_tsan_annotations.cpp).
function(kvc_router_target_options target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "NO_WERROR" "" "")
  set(_werror ${KVC_ROUTER_WERROR})
  if(arg_NO_WERROR)
    set(_werror OFF)
  endif()

  if(MSVC)
    target_compile_options(${target} PRIVATE /W4)
    if(_werror)
      target_compile_options(${target} PRIVATE /WX)
    endif()
  else()
    # -Wno-missing-field-initializers: GCC 12's -Wextra flags C++20
    # designated initializers that omit members with default initializers
    # (Request{.session = 5, .turn = 1}), which is the intended idiom here.
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic
                                             -Wno-missing-field-initializers)
    if(_werror)
      target_compile_options(${target} PRIVATE -Werror)
    endif()
    # GCC's -Wmaybe-uninitialized gives false positives under sanitizer
    # instrumentation (documented in the GCC manual; GCC 12 reports them even
    # inside libstdc++'s <regex>/<functional>).
    if(KVC_ROUTER_SANITIZE_FLAGS AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      target_compile_options(${target} PRIVATE -Wno-maybe-uninitialized)
    endif()
  endif()

  if(KVC_ROUTER_SANITIZE_FLAGS)
    target_compile_options(${target} PRIVATE ${KVC_ROUTER_SANITIZE_FLAGS})
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "EXECUTABLE" OR _type STREQUAL "SHARED_LIBRARY"
       OR _type STREQUAL "MODULE_LIBRARY")
      target_link_options(${target} PRIVATE ${KVC_ROUTER_SANITIZE_FLAGS})
    endif()
    if(_type STREQUAL "EXECUTABLE" AND TARGET kvc_router_tsan_support)
      target_link_libraries(${target} PRIVATE kvc_router_tsan_support)
    endif()
  endif()
endfunction()
