# strata-bench: benchmarks (not tests). Each subcommand prints a table and ends with one JSON
# line of its figures, as ratios to a ceiling measured in the same run (DESIGN §7). Built by
# default; `strata-bench --help` lists the subcommands.
file(GLOB strata_bench_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tools/bench/*.cpp)
add_executable(strata-bench ${strata_bench_sources})
target_link_libraries(strata-bench PRIVATE strata_lib)
target_compile_definitions(strata-bench PRIVATE STRATA_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
