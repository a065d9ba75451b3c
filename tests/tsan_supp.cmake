# ThreadSanitizer builds only: tools/sanitizers/check_tsan_supp checks tsan.supp and common/tsan.h
# against the installed oneTBB / OpenBLAS / oneDNN before the suite relies on them (a program built
# with -fsanitize=thread is clean with the file; a race between two std::threads, one between two
# oneTBB tasks and an unannotated oneTBB join are each reported).
if(KILN_SANITIZE MATCHES "thread")
  add_test(NAME TsanSuppressions COMMAND ${CMAKE_SOURCE_DIR}/tools/sanitizers/check_tsan_supp)
  set_tests_properties(TsanSuppressions PROPERTIES LABELS sanitizer TIMEOUT 60)
endif()
