# The Hopper kernels' GPU builds (sm_90a). wgmma and setmaxnreg exist only in the sm_90a feature set, so these
# targets compile for that one architecture.
if(NOT FLASHLAB_HAVE_CUDA)
  return()
endif()

set(FLASHLAB_HOPPER_GENCODE "-gencode=arch=compute_90a,code=sm_90a")

function(flashlab_hopper_cuda_target target)
  set_property(TARGET ${target} PROPERTY CUDA_ARCHITECTURES OFF)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${FLASHLAB_HOPPER_GENCODE}>)
endfunction()

add_library(flashlab_hopper_ws STATIC ${CMAKE_CURRENT_LIST_DIR}/ws_core.cu ${CMAKE_CURRENT_LIST_DIR}/ws_launch.cu)
target_link_libraries(flashlab_hopper_ws PUBLIC flashlab_gpu_stage CUDA::cudart)
flashlab_hopper_cuda_target(flashlab_hopper_ws)

add_library(flashlab_hopper_fp8 STATIC ${CMAKE_CURRENT_LIST_DIR}/fp8_prepass.cu ${CMAKE_CURRENT_LIST_DIR}/fp8_launch.cu
                                       ${CMAKE_CURRENT_LIST_DIR}/fp8_stage.cu)
target_link_libraries(flashlab_hopper_fp8 PUBLIC flashlab_gpu_stage CUDA::cudart)
flashlab_hopper_cuda_target(flashlab_hopper_fp8)
flashlab_gpu_options(flashlab_hopper_ws_emulated "${FLASHLAB_HOPPER_GENCODE}")
flashlab_gpu_options(flashlab_hopper_fp8_emulated "${FLASHLAB_HOPPER_GENCODE}")

# The PTX, for the compile-time evidence (HOPPER.md): `cmake --build build --target hopper_ws_ptx`.
add_library(hopper_ws_ptx OBJECT EXCLUDE_FROM_ALL ${CMAKE_CURRENT_LIST_DIR}/ws_launch.cu)
target_link_libraries(hopper_ws_ptx PRIVATE flashlab_common)
set_property(TARGET hopper_ws_ptx PROPERTY CUDA_ARCHITECTURES OFF)
target_compile_options(hopper_ws_ptx PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=compute_90a>)
set_target_properties(hopper_ws_ptx PROPERTIES CUDA_PTX_COMPILATION ON)

# A fact of the build, checked: ptxas gives the warp-specialized kernels the register count their setmaxnreg
# split relies on (168 a thread of 384, 128 of 512; check_registers.py says why). The build fails otherwise.
# The GPU build's compiles ask ptxas for its report (-Xptxas -v), which ptxas_log.py keeps beside each object;
# the check reads those of the objects the libraries hold. A launcher the build already has (ccache, say) runs
# inside it, and a change to ptxas_log.py recompiles the objects, so that their reports are its own.
foreach(target flashlab_hopper_ws flashlab_hopper_fp8)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
  set_property(TARGET ${target} PROPERTY CUDA_COMPILER_LAUNCHER python3 ${CMAKE_CURRENT_LIST_DIR}/ptxas_log.py
                                                                ${CMAKE_CUDA_COMPILER_LAUNCHER})
  get_target_property(sources ${target} SOURCES)
  set_property(SOURCE ${sources} APPEND PROPERTY OBJECT_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/ptxas_log.py)
endforeach()
set(FLASHLAB_HOPPER_REGISTERS ${CMAKE_CURRENT_BINARY_DIR}/hopper_registers.txt)
add_custom_command(
  OUTPUT ${FLASHLAB_HOPPER_REGISTERS}
  COMMAND python3 ${CMAKE_CURRENT_LIST_DIR}/check_registers.py --output ${FLASHLAB_HOPPER_REGISTERS}
          "$<TARGET_OBJECTS:flashlab_hopper_ws>" "$<TARGET_OBJECTS:flashlab_hopper_fp8>"
  COMMAND_EXPAND_LISTS
  DEPENDS ${CMAKE_CURRENT_LIST_DIR}/check_registers.py flashlab_hopper_ws flashlab_hopper_fp8
  COMMENT "Checking ptxas's register count of the warp-specialized Hopper kernels")
add_custom_target(hopper_register_check ALL DEPENDS ${FLASHLAB_HOPPER_REGISTERS})
