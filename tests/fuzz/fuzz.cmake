# fuzz.cmake: initial cache of the fuzzing build (clang, libFuzzer, ASan, UBSan).
#
#   cmake -C tests/fuzz/fuzz.cmake -S . -B build-fuzz
#   cmake --build build-fuzz --target fuzz_reader fuzz_shard
#   tests/fuzz/run.sh build-fuzz 60
#
# Every library is compiled with coverage instrumentation (fuzzer-no-link)
# and the sanitizers; only the harnesses link libFuzzer's main().
set(CMAKE_C_COMPILER clang CACHE STRING "")
set(CMAKE_C_FLAGS "-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" CACHE STRING "")
set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "")
set(GIFT_FUZZ ON CACHE BOOL "")
set(GIFT_WITH_CUDA OFF CACHE STRING "")
set(GIFT_WERROR OFF CACHE BOOL "")
