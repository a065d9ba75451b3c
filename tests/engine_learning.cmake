# The tiny config learns on the quickstart's data within the quickstart's step budget
# (tests/engine_learning.sh states the margin). About 2 minutes on 2 cores.
add_test(NAME engine_learning
         COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/engine_learning.sh $<TARGET_FILE:kiln>
                 ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/engine_learning)
set_tests_properties(engine_learning PROPERTIES LABELS "e2e" TIMEOUT 900)
