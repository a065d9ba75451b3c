# tools/gpu_check without a GPU.
# gpu_check_selftest: the script itself against stand-in programs that pass, fail, skip, crash and
# hang (tests/tools/gpu_check_fakes/): every outcome's status, the exit code, summary.json, the
# failed rows' logs, the preflight, --deadline, a stop from outside (gpu_check_selftest.py).
add_test(NAME gpu_check_selftest
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_LIST_DIR}/gpu_check_selftest.py
                 ${CMAKE_SOURCE_DIR}/tools/gpu_check)
set_tests_properties(gpu_check_selftest PROPERTIES LABELS "gpu_check" TIMEOUT 600)
# gpu_check_cpu_rows: the training rows run with device cpu (--cpu-rows), so their commands and
# comparisons are checked on every build, not first on a GPU machine.
add_test(NAME gpu_check_cpu_rows
         COMMAND ${CMAKE_SOURCE_DIR}/tools/gpu_check --cpu-rows
                 --out ${CMAKE_CURRENT_BINARY_DIR}/gpu_check_cpu_rows)
set_tests_properties(gpu_check_cpu_rows PROPERTIES LABELS "gpu_check" TIMEOUT 1200
                     ENVIRONMENT "KILN_BUILD_DIR=$<TARGET_FILE_DIR:kiln>;OMP_NUM_THREADS=2")
