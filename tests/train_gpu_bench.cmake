# tools/bench/train_gpu's harness on the CPU with the tiny config (tests/python/train_gpu_bench.py):
# Kiln and PyTorch (Debian's python3-torch) on the same model and batch, and the report.
if(KILN_BENCH)
  add_test(NAME bench_train_gpu_harness
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/train_gpu_bench.py
                   ${CMAKE_SOURCE_DIR} ${CMAKE_BINARY_DIR}/bench
                   ${CMAKE_CURRENT_BINARY_DIR}/bench_train_gpu_work)
  set_tests_properties(bench_train_gpu_harness PROPERTIES LABELS "python;bench" TIMEOUT 600
                       ENVIRONMENT "OMP_NUM_THREADS=2")
endif()
