# The CUDA operator test: every kernels/cuda op against the CPU kernels (and the reference), on the
# same inputs. Built only when the CUDA kernels are (a CUDA toolkit was found); its tests skip
# (GTEST_SKIP) when no GPU is present, so it is safe to run everywhere.
if(TARGET kiln_kernels_cuda)
  add_executable(kernels_cuda_gpu ${CMAKE_CURRENT_LIST_DIR}/kernels_cuda_gpu.cc)
  target_compile_options(kernels_cuda_gpu PRIVATE ${KILN_WARNINGS})
  target_link_libraries(kernels_cuda_gpu PRIVATE kiln_kernels_cuda kiln_kernels kiln_common
                        GTest::gtest GTest::gtest_main)
  gtest_discover_tests(kernels_cuda_gpu DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "unit;gpu")
endif()
