# The tiny config learns on the quickstart's data within the quickstart's step budget
# (tests/engine_learning.sh states the margin). About 2 minutes each on 2 cores.
#   engine_learning           fp32 on the best CPU path
#   engine_learning_bf16_avx2 bf16 forced onto the AVX2 path (KILN_CPU_ISA=avx2, oneDNN and
#                             OpenBLAS capped to match): the quickstart's prep and train run there
#                             without an illegal instruction on any CPU, and bf16 learns like fp32
# Under ThreadSanitizer both run 60 steps (checkpoints every 20) and must gain 1.0 nats: a TSan
# bf16 step takes 20-45 s on 2 cores, so 300 would take hours (docs/HARDENING.md).
set(kiln_learning_len "")
if(KILN_SANITIZE MATCHES "thread")
  set(kiln_learning_len 60 1.0)
endif()
add_test(NAME engine_learning
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/engine_learning.sh $<TARGET_FILE:kiln>
                 ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/engine_learning fp32
                 ${kiln_learning_len})
set_tests_properties(engine_learning PROPERTIES LABELS "e2e" TIMEOUT 900)
add_test(NAME engine_learning_bf16_avx2
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/engine_learning.sh $<TARGET_FILE:kiln>
                 ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/engine_learning_bf16_avx2 bf16
                 ${kiln_learning_len})
set_tests_properties(engine_learning_bf16_avx2 PROPERTIES LABELS "e2e;cpu_avx2" TIMEOUT 900
  ENVIRONMENT "KILN_CPU_ISA=avx2;ONEDNN_MAX_CPU_ISA=AVX2;OPENBLAS_CORETYPE=Haswell")
