# decoding/cuda_split_kv: Flash-Decoding on CUDA (fp16/bf16). The kernels and the launcher (cuda_split_kv.cu)
# are built for the emulator always, and for the GPU (sm_80 and sm_90a) when the build has CUDA; like the
# Hopper stage, each GPU target turns CMake's architecture handling off and passes its -gencode pairs itself.
flashlab_emulated_library(flashlab_decoding_cuda_emulated ${CMAKE_CURRENT_LIST_DIR}/cuda_core.cu
                          ${CMAKE_CURRENT_LIST_DIR}/cuda_split_kv.cu)
if(NOT FLASHLAB_HAVE_CUDA)
  return()
endif()

set(FLASHLAB_DECODING_GENCODE "-gencode=arch=compute_80,code=sm_80;-gencode=arch=compute_90a,code=sm_90a")

function(flashlab_decoding_cuda_target target)
  set_property(TARGET ${target} PROPERTY CUDA_ARCHITECTURES OFF)
  # The shared SoftmaxState is constexpr-friendly host code (std::max, numeric_limits) called from the kernels.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${FLASHLAB_DECODING_GENCODE} --expt-relaxed-constexpr>)
endfunction()

add_library(flashlab_decoding_cuda STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_core.cu ${CMAKE_CURRENT_LIST_DIR}/cuda_split_kv.cu)
target_link_libraries(flashlab_decoding_cuda PUBLIC flashlab_gpu_stage CUDA::cudart)
flashlab_decoding_cuda_target(flashlab_decoding_cuda)
flashlab_gpu_options(flashlab_decoding_cuda_emulated "${FLASHLAB_DECODING_GENCODE};--expt-relaxed-constexpr")

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
