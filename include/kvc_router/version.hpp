// kvc_router/version.hpp
//
// The library's version. CMake parses the three macros below to set the project
// version, so keep their spelling.
#pragma once

#define KVC_ROUTER_VERSION_MAJOR 0
#define KVC_ROUTER_VERSION_MINOR 1
#define KVC_ROUTER_VERSION_PATCH 0

namespace kvc_router {

inline constexpr int kVersionMajor = KVC_ROUTER_VERSION_MAJOR;
inline constexpr int kVersionMinor = KVC_ROUTER_VERSION_MINOR;
inline constexpr int kVersionPatch = KVC_ROUTER_VERSION_PATCH;
inline constexpr const char kVersionString[] = "0.1.0";

}  // namespace kvc_router
