#pragma once
// Catch2 v3 (catch2/catch_all.hpp) or v2 (catch2/catch.hpp), whichever this machine has.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
using Catch::Approx;   // global in 2.13, in namespace Catch in 3
#else
#include <catch2/catch.hpp>
#endif

// Skips the rest of a test case with a message: Catch2 3 reports it as skipped; 2.13 has no SKIP, so
// there it warns and leaves the test case.
#if defined(SKIP)
#define REPLICA_SKIP(message) SKIP(message)
#else
#define REPLICA_SKIP(message)                  \
    do {                                       \
        WARN("skipped: " << message);          \
        return;                                \
    } while (0)
#endif
