// The Catch2 entry point of strata_cuemu_tests, the CUDA emulator's own tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
