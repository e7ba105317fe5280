#pragma once
// Catch2 v3 (catch2/catch_all.hpp) or v2 (catch2/catch.hpp), whichever this machine has.
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
