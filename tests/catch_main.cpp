// The test runner's main, compiled once (Catch2 v2; v3 links catch2-with-main instead).
#if !__has_include(<catch2/catch_all.hpp>)
#define CATCH_CONFIG_MAIN
#include "catch.hpp"
#endif
