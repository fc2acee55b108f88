// The Catch2 entry point: one translation unit, so the rest of the suite compiles fast.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
