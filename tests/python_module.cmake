# The Python module kiln (python/) with Debian's /usr/bin/python3, python3-numpy and python3-torch
# (tools/setup installs them); PYTHONPATH=build/python is the one step that makes `import kiln`
# work. These tests FAIL (not skip) when the module or torch is missing.
if(TARGET kiln_python)
  add_executable(kiln_dataset_fixture ${CMAKE_CURRENT_SOURCE_DIR}/python/kiln_dataset_fixture.cc)
  target_compile_options(kiln_dataset_fixture PRIVATE ${KILN_WARNINGS})
  target_link_libraries(kiln_dataset_fixture PRIVATE kiln_loader kiln_format kiln_common)
  set(kiln_py_env "PYTHONPATH=${CMAKE_BINARY_DIR}/python" "OMP_NUM_THREADS=1")

  add_test(NAME python_loader
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/kiln_loader_test.py
                   $<TARGET_FILE:kiln> $<TARGET_FILE:kiln_dataset_fixture>
                   ${CMAKE_CURRENT_BINARY_DIR}/python_loader_work)
  set_tests_properties(python_loader PROPERTIES LABELS "python" TIMEOUT 300
                       ENVIRONMENT "${kiln_py_env}")

  add_test(NAME python_torch
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/kiln_torch_test.py
                   $<TARGET_FILE:kiln_dataset_fixture> ${CMAKE_CURRENT_BINARY_DIR}/python_torch_work)
  set_tests_properties(python_torch PROPERTIES LABELS "python" TIMEOUT 300
                       ENVIRONMENT "${kiln_py_env}")

  # Two processes under torch.distributed.run (gloo); the script launches itself under it with
  # 127.0.0.1 and a free port (see its docstring).
  add_test(NAME python_torch_dist
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/kiln_torch_dist.py
                   $<TARGET_FILE:kiln> $<TARGET_FILE:kiln_dataset_fixture>
                   ${CMAKE_CURRENT_BINARY_DIR}/python_torch_dist_work)
  set_tests_properties(python_torch_dist PROPERTIES LABELS "python;mpi" TIMEOUT 300
                       ENVIRONMENT "${kiln_py_env}")

  # examples/torch_train.py trains (its loss falls), follows the weights and resumes exactly.
  add_test(NAME python_torch_train_example
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/python/torch_train_example.py
                   $<TARGET_FILE:kiln> ${CMAKE_SOURCE_DIR}
                   ${CMAKE_CURRENT_BINARY_DIR}/python_torch_train_example_work)
  set_tests_properties(python_torch_train_example PROPERTIES LABELS "python;e2e" TIMEOUT 600
                       ENVIRONMENT "${kiln_py_env}")
endif()
