# CUDA is optional. AUTO turns it on when nvcc is found; ON requires it; OFF skips every CUDA source.
# Architectures default to sm_80 and sm_90a, written as explicit -gencode pairs: the Hopper stage needs the "a"
# feature set (wgmma, setmaxnreg), and a generic compute_90 PTX would be rejected by ptxas for those instructions.
set(FLASHLAB_HAVE_CUDA OFF)
set(FLASHLAB_CUDA_GENCODE "-gencode=arch=compute_80,code=sm_80;-gencode=arch=compute_90a,code=sm_90a"
    CACHE STRING "nvcc -gencode flags for the CUDA stages")
if(NOT FLASHLAB_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(CMAKE_CUDA_ARCHITECTURES OFF)
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc's C++20 flag (nvcc 12+ accepts -std=c++20): teach it, or CMAKE_CUDA_STANDARD 20
    # fails at generation time.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(FLASHLAB_HAVE_CUDA ON)
  elseif(FLASHLAB_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLASHLAB_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
message(STATUS "flashlab: CUDA stages ${FLASHLAB_HAVE_CUDA} (FLASHLAB_CUDA=${FLASHLAB_CUDA})")

# flashlab_gpu_kernels(target SOURCES...): a stage's kernels built by nvcc for FLASHLAB_CUDA_GENCODE, with -lineinfo
# (compute-sanitizer reports source lines; it changes no generated code) and the host compiler's warnings (errors
# under FLASHLAB_WERROR). The stage links it; its own objects stay the registrations alone.
function(flashlab_gpu_kernels target)
  add_library(${target} STATIC ${ARGN})
  target_link_libraries(${target} PUBLIC flashlab_gpu_stage CUDA::cudart PRIVATE flashlab_warnings)
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CUDA>:${FLASHLAB_CUDA_GENCODE};-lineinfo;-Xcompiler=-Wall,-Wextra>"
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${FLASHLAB_WERROR}>>:-Werror=all-warnings>)
endfunction()
