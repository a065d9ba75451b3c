# Full disks and permissions (tests/full_disk.sh): ENOSPC on a small tmpfs for prep and train
# (message names the path; the last complete output survives; the rerun resumes), EACCES as an
# unprivileged user. Skipped (exit 77) where user namespaces are unavailable.
foreach(check prep_enospc train_enospc eacces)
  add_test(NAME full_disk_${check}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/full_disk.sh ${check} $<TARGET_FILE:kiln>
                   ${CMAKE_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/full_disk)
  set_tests_properties(full_disk_${check} PROPERTIES LABELS e2e TIMEOUT 300 SKIP_RETURN_CODE 77)
endforeach()
