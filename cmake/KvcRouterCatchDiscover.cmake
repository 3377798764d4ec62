# kvc_router_catch_discover_tests(<target>
#     [TEST_PREFIX <prefix>]
#     [DISCOVERY_TIMEOUT <seconds>]      # default 60
#     [WORKING_DIRECTORY <dir>]
#     [LABELS <label>...]
#     [EXTRA_ARGS <arg>...]
#     [PROPERTIES <name> <value> ...])   # scalar-valued test properties
#
# Registers one CTest test per Catch2 (v2) TEST_CASE of <target>.
#
# Why not Catch2 2.13's own catch_discover_tests(): that version has neither
# DISCOVERY_TIMEOUT nor DISCOVERY_MODE; it runs the test executable as a
# POST_BUILD step, so a hang at start-up hangs the build and a sanitizer crash
# during listing breaks the build instead of failing a test. This variant
# discovers at CTest time (like gtest_discover_tests(DISCOVERY_MODE PRE_TEST)):
#   * `<exe> --list-test-names-only` runs when ctest starts, with a timeout,
#     and is cached until the executable changes;
#   * if the executable is missing, or listing crashes/times out, a failing
#     test named <target>_NOT_BUILT / <target>_DISCOVERY_FAILED is registered;
#   * each test runs `<exe> <escaped name> --warn NoTests`, so a name that no
#     longer matches any test case fails instead of silently passing.
include_guard(GLOBAL)


function(kvc_router_catch_discover_tests target)
  cmake_parse_arguments(PARSE_ARGV 1 arg ""
    "TEST_PREFIX;DISCOVERY_TIMEOUT;WORKING_DIRECTORY"
    "LABELS;EXTRA_ARGS;PROPERTIES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kvc_router_catch_discover_tests: unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_DISCOVERY_TIMEOUT)
    set(arg_DISCOVERY_TIMEOUT 60)
  endif()
  if(NOT arg_WORKING_DIRECTORY)
    set(arg_WORKING_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  endif()

  get_property(_multi GLOBAL PROPERTY GENERATOR_IS_MULTI_CONFIG)
  set(_base "${CMAKE_CURRENT_BINARY_DIR}/${target}")
  if(_multi)
    set(_cfg "_$<CONFIG>")
  else()
    set(_cfg "")
  endif()

  # Bracket arguments keep ';' lists and special characters intact.
  string(CONCAT _content
    "set(KVC_DISCOVER_TARGET [==[${target}]==])\n"
    "set(KVC_DISCOVER_EXECUTABLE [==[$<TARGET_FILE:${target}>]==])\n"
    "set(KVC_DISCOVER_TIMEOUT [==[${arg_DISCOVERY_TIMEOUT}]==])\n"
    "set(KVC_DISCOVER_PREFIX [==[${arg_TEST_PREFIX}]==])\n"
    "set(KVC_DISCOVER_WORKING_DIR [==[${arg_WORKING_DIRECTORY}]==])\n"
    "set(KVC_DISCOVER_LABELS [==[${arg_LABELS}]==])\n"
    "set(KVC_DISCOVER_EXTRA_ARGS [==[${arg_EXTRA_ARGS}]==])\n"
    "set(KVC_DISCOVER_PROPERTIES [==[${arg_PROPERTIES}]==])\n"
    "set(KVC_DISCOVER_CACHE_FILE [==[${_base}${_cfg}_tests.cmake]==])\n"
    "set(KVC_DISCOVER_SELF [==[${_base}${_cfg}_discover.cmake]==])\n"
    "include([==[${CMAKE_CURRENT_FUNCTION_LIST_DIR}/KvcRouterCatchDiscoverImpl.cmake]==])\n")
  file(GENERATE OUTPUT "${_base}${_cfg}_discover.cmake" CONTENT "${_content}")

  if(_multi)
    set(_include_file "${_base}_discover_include.cmake")
    file(WRITE "${_include_file}"
      "if(EXISTS \"${_base}_\${CTEST_CONFIGURATION_TYPE}_discover.cmake\")\n"
      "  include(\"${_base}_\${CTEST_CONFIGURATION_TYPE}_discover.cmake\")\n"
      "else()\n"
      "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
      "endif()\n")
  else()
    set(_include_file "${_base}_discover.cmake")
  endif()
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${_include_file}")
endfunction()
