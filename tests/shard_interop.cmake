# Shards seen by other tools: GNU tar (after zstd -d) and Python's tarfile + numpy read what Kiln
# writes, and Kiln reads what they write. Needs /usr/bin/python3 with python3-numpy, tar, zstd.
add_executable(shard_interop_fixture ${CMAKE_CURRENT_SOURCE_DIR}/python/shard_interop_fixture.cc)
target_compile_options(shard_interop_fixture PRIVATE ${KILN_WARNINGS})
target_link_libraries(shard_interop_fixture PRIVATE kiln_format kiln_common)
add_test(NAME shard_interop
         COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/shard_interop.py
                 $<TARGET_FILE:shard_interop_fixture> ${CMAKE_CURRENT_BINARY_DIR}/shard_interop_work)
set_tests_properties(shard_interop PROPERTIES LABELS "python;interop" TIMEOUT 120)
