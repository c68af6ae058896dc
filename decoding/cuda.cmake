# decoding/cuda_split_kv: Flash-Decoding on CUDA (fp16/bf16, sm_80 and sm_90a). Built only with CUDA. Like the
# Hopper stage, each target turns CMake's architecture handling off and passes its -gencode pairs itself.
if(NOT FLASHLAB_HAVE_CUDA)
  return()
endif()

set(FLASHLAB_DECODING_GENCODE "-gencode=arch=compute_80,code=sm_80;-gencode=arch=compute_90a,code=sm_90a")

function(flashlab_decoding_cuda_target target)
  set_property(TARGET ${target} PROPERTY CUDA_ARCHITECTURES OFF)
  # The shared SoftmaxState is constexpr-friendly host code (std::max, numeric_limits) called from the kernels.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${FLASHLAB_DECODING_GENCODE} --expt-relaxed-constexpr>)
endfunction()

add_library(flashlab_decoding_cuda STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_split_kv.cu)
target_link_libraries(flashlab_decoding_cuda PUBLIC flashlab_common CUDA::cudart)
flashlab_decoding_cuda_target(flashlab_decoding_cuda)

# The self-test: correctness against the fp64 reference on decode shapes, and the bandwidth timings. Built here
# so it always compiles; it needs a GPU (sm_80 or newer) to run.
add_executable(decoding_cuda_selftest ${CMAKE_CURRENT_LIST_DIR}/cuda_selftest.cu)
target_link_libraries(decoding_cuda_selftest PRIVATE flashlab_decoding_cuda flashlab_common)
flashlab_decoding_cuda_target(decoding_cuda_selftest)
set_target_properties(decoding_cuda_selftest PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)

# The PTX and the ptxas report, for the compile-time evidence (decoding/CUDA.md):
# `cmake --build build --target decoding_cuda_ptx` and `--target decoding_cuda_ptxas`.
add_library(decoding_cuda_ptx OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/cuda_split_kv.cu)
target_link_libraries(decoding_cuda_ptx PRIVATE flashlab_common)
set_property(TARGET decoding_cuda_ptx PROPERTY CUDA_ARCHITECTURES OFF)
target_compile_options(decoding_cuda_ptx PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_80,code=compute_80 --expt-relaxed-constexpr>)
set_target_properties(decoding_cuda_ptx PROPERTIES CUDA_PTX_COMPILATION ON)

add_library(decoding_cuda_ptxas OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/cuda_split_kv.cu)
target_link_libraries(decoding_cuda_ptxas PRIVATE flashlab_common)
flashlab_decoding_cuda_target(decoding_cuda_ptxas)
target_compile_options(decoding_cuda_ptxas PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
