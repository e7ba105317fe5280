#pragma once
// The library's version, for the preprocessor. It is the project version in meson.build, which
// refuses to configure when the two differ; the CMake package and pkg-config files carry the same.
//
//   #if REPLICA_VERSION >= 200   // 0.2.0 or later
//
// Before 1.0 a minor version may change the API: find_package(replica 0.2) accepts 0.2.x only.

#define REPLICA_VERSION_MAJOR 0
#define REPLICA_VERSION_MINOR 2
#define REPLICA_VERSION_PATCH 0

// MAJOR * 10000 + MINOR * 100 + PATCH: one number to compare.
#define REPLICA_VERSION (REPLICA_VERSION_MAJOR * 10000 + REPLICA_VERSION_MINOR * 100 + REPLICA_VERSION_PATCH)
