# Script mode: cmake -DKVC_FILES=a|b|c [-DKVC_EXPECTED_COUNT=N] -P KvcRouterCheckFilesExist.cmake
# Fails unless every listed file exists (and, if given, there are N of them).
# Used by the header_self_containment test to assert that the
# kvc_router_header_check object library was actually built.
string(REPLACE "|" ";" _files "${KVC_FILES}")
list(LENGTH _files _count)
if(DEFINED KVC_EXPECTED_COUNT AND NOT _count EQUAL KVC_EXPECTED_COUNT)
  message(FATAL_ERROR "expected ${KVC_EXPECTED_COUNT} files, got ${_count}")
endif()
set(_missing "")
foreach(_f IN LISTS _files)
  if(NOT EXISTS "${_f}")
    list(APPEND _missing "${_f}")
  endif()
endforeach()
if(_missing)
  string(REPLACE ";" "\n  " _missing "${_missing}")
  message(FATAL_ERROR "not built (run the build first):\n  ${_missing}")
endif()
message(STATUS "${_count} header self-containment objects present")
