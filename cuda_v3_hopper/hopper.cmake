# cuda_v3_hopper/ws: FlashAttention-3 (bf16/fp16) for sm_90a. Built only with CUDA; the kernels use wgmma and
# setmaxnreg, which exist only in the sm_90a feature set, so these targets compile for that one architecture.
if(NOT FLASHLAB_HAVE_CUDA)
  return()
endif()

option(FLASHLAB_HOPPER_ABLATION "Build the lower rungs of the FA3 ablation ladder (extra kernels)" ON)
set(FLASHLAB_HOPPER_GENCODE "-gencode=arch=compute_90a,code=sm_90a")

function(flashlab_hopper_cuda_target target)
  set_property(TARGET ${target} PROPERTY CUDA_ARCHITECTURES OFF)
endfunction()

add_library(flashlab_hopper_ws STATIC ${CMAKE_CURRENT_LIST_DIR}/ws_launch.cu)
target_link_libraries(flashlab_hopper_ws PUBLIC flashlab_gpu_stage CUDA::cudart)
target_compile_definitions(flashlab_hopper_ws PRIVATE FLASHLAB_HOPPER_ABLATION=$<BOOL:${FLASHLAB_HOPPER_ABLATION}>)
target_compile_options(flashlab_hopper_ws PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${FLASHLAB_HOPPER_GENCODE}>)
flashlab_hopper_cuda_target(flashlab_hopper_ws)

# The self-test: correctness against the fp64 reference on awkward shapes, and the ablation ladder's timings.
# Built here so it always compiles; it needs an H100/H200 to run.
add_executable(hopper_ws_selftest ${CMAKE_CURRENT_LIST_DIR}/ws_selftest.cu)
target_link_libraries(hopper_ws_selftest PRIVATE flashlab_hopper_ws flashlab_common)
target_compile_options(hopper_ws_selftest PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${FLASHLAB_HOPPER_GENCODE}>)
flashlab_hopper_cuda_target(hopper_ws_selftest)
set_target_properties(hopper_ws_selftest PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)

# The PTX, for the compile-time evidence (HOPPER.md): `cmake --build build --target hopper_ws_ptx`.
add_library(hopper_ws_ptx OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/ws_launch.cu)
target_link_libraries(hopper_ws_ptx PRIVATE flashlab_common)
target_compile_options(hopper_ws_ptx PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=compute_90a>)
flashlab_hopper_cuda_target(hopper_ws_ptx)
set_target_properties(hopper_ws_ptx PROPERTIES CUDA_PTX_COMPILATION ON)

# cuda_v3_hopper/fp8: the FP8 pre-pass (bf16 Q, K, V to e4m3 operands and tile scales), the main kernel (d 128
# and 256), their set-up on device tensors (fp8_stage.cu: the registry's launcher, which the self-test drives
# too), and their self-test, which checks the pre-pass bit for bit and the kernel within a derived bound
# against the emulation (fp8_emulated.cpp, linked in as the reference).
add_library(flashlab_hopper_fp8 STATIC ${CMAKE_CURRENT_LIST_DIR}/fp8_prepass.cu ${CMAKE_CURRENT_LIST_DIR}/fp8_launch.cu
                                       ${CMAKE_CURRENT_LIST_DIR}/fp8_stage.cu)
target_link_libraries(flashlab_hopper_fp8 PUBLIC flashlab_gpu_stage CUDA::cudart)
target_compile_options(flashlab_hopper_fp8 PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${FLASHLAB_HOPPER_GENCODE}>)
flashlab_hopper_cuda_target(flashlab_hopper_fp8)

add_executable(fp8_selftest ${CMAKE_CURRENT_LIST_DIR}/fp8_selftest.cu)
target_link_libraries(fp8_selftest PRIVATE flashlab_hopper_fp8 flashlab_fp8_emulated flashlab_common)
target_compile_options(fp8_selftest PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${FLASHLAB_HOPPER_GENCODE}>)
flashlab_hopper_cuda_target(fp8_selftest)
set_target_properties(fp8_selftest PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
# In ctest: passes or fails on an sm_90 GPU, skipped (exit code 2, reason printed) anywhere else.
add_test(NAME fp8_selftest COMMAND fp8_selftest)
set_tests_properties(fp8_selftest PROPERTIES LABELS "cuda" SKIP_RETURN_CODE 2)
