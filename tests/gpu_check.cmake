# tools/gpu_check's training rows run with device cpu (--cpu-rows), so their commands and
# comparisons are checked on every build, not first on a GPU machine.
add_test(NAME gpu_check_cpu_rows COMMAND ${CMAKE_SOURCE_DIR}/tools/gpu_check --cpu-rows)
set_tests_properties(gpu_check_cpu_rows PROPERTIES LABELS "gpu_check" TIMEOUT 600
                     ENVIRONMENT "KILN_BUILD_DIR=$<TARGET_FILE_DIR:kiln>;OMP_NUM_THREADS=2")
