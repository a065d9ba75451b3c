# The CUDA modules (common/cuda_module.h), built beside the kiln executable when CMake found the
# CUDA toolkit (and NCCL):
#   libkiln_cuda.so  engine/device/cuda_module.cc + the CUDA kernels (kiln_kernels_cuda): the CUDA
#                    backend and model, and inference on the GPU (engine/infer/gpt_infer_cuda.cc,
#                    infer_kernels.cu); links cuBLAS/cuBLASLt (the CUDA runtime statically)
#   libkiln_nccl.so  comm/nccl_group.cc: the NCCL process group; links NCCL
# Each carries its own copy of the Kiln code it calls (linked with --no-undefined, so it loads
# into any Kiln executable); at run time those calls bind to the executable's exported copies
# (cmake/kiln_exports.list), so there is one logger, one world group, one CPU backend.
set(kiln_module_dir ${CMAKE_BINARY_DIR})

function(kiln_cuda_module name)
  set_target_properties(${name} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${kiln_module_dir}
    PREFIX "lib")
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KILN_WARNINGS}>)
  target_compile_definitions(${name} PRIVATE KILN_CUDA_MODULE_STAMP="${KILN_CUDA_MODULE_STAMP}")
  target_link_options(${name} PRIVATE LINKER:--no-undefined LINKER:-soname,lib${name}.so)
  add_dependencies(kiln ${name})  # `--target kiln` gives a kiln that can load it
endfunction()

if(TARGET kiln_kernels_cuda)
  add_library(kiln_cuda MODULE ${CMAKE_SOURCE_DIR}/engine/device/cuda_module.cc
              ${CMAKE_SOURCE_DIR}/engine/infer/gpt_infer_cuda.cc ${CMAKE_SOURCE_DIR}/engine/infer/infer_kernels.cu)
  target_link_libraries(kiln_cuda PRIVATE kiln_kernels_cuda kiln_engine kiln_comm kiln_kernels kiln_common)
  kiln_cuda_module(kiln_cuda)
endif()

if(KILN_HAVE_NCCL)
  add_library(kiln_nccl MODULE ${CMAKE_SOURCE_DIR}/comm/nccl_group.cc)
  target_include_directories(kiln_nccl PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(kiln_nccl PRIVATE kiln_comm kiln_common CUDA::cudart_static ${NCCL_LIBRARY})
  kiln_cuda_module(kiln_nccl)
endif()
