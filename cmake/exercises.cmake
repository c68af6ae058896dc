# Course exercises: each workspace written by `./flashlab exercise start` (tools/exercise.py) holds a student's copy
# of one stage and an exercise.cmake that calls flashlab_add_exercise(). The program links the shared harness to that
# copy (not to the real stage) and registers its implementations as "exercise/ID/<name>".
set(FLASHLAB_EXERCISE_DIRS "" CACHE STRING "Exercise workspaces to build (maintained by ./flashlab exercise)")
option(FLASHLAB_EXERCISE_GPU "Also build the CUDA exercises' copies for the GPU (./flashlab exercise check sets it where a GPU is)" OFF)

# flashlab_add_exercise(target id dir SOURCES... [REUSE FILES...]): SOURCES are compiled from the workspace `dir`;
# each REUSE file (stage-relative, e.g. naive/attention.cpp) is linked as the object its stage already built, which
# tools/exercise.py allows only for files that neither hold nor include the exercise's lines. A REUSE file that no
# stage builds is compiled from the workspace like the others.
#
# CUDA FILES...: kernels (e.g. cuda_v2/split_q.cu) that hold or include the exercise's lines. Every emulated library
# of a stage that holds one is replaced: those kernels are compiled from the workspace for the emulator (an object
# library, so that its definitions are the ones linked), the library's other kernels are linked as the objects the
# stage already built (they neither hold nor include the lines, so the copies would compile to the same code), and
# every REUSE file whose stage links that library is compiled from the workspace too (a registration must call the
# student's launcher, not the stage's). The program is
# built for the emulator only (FLASHLAB_EMULATOR_ONLY): graded there on every machine, and first where a GPU is
# (a deadlock is reported there; on the GPU it would hang). With FLASHLAB_EXERCISE_GPU a second program,
# TARGET_gpu, also links the copy's kernels built by nvcc.
#
# QUICK: the copy is compiled at -O1, for a program that only has to fail a check (the exercise self-test's
# skeletons and known mistakes, which stop at the first failure): about half the compile time of the release
# flags. Not -O0: there the emulator counts fewer global bytes than the kernel moves at -O1 and above (measured:
# cuda_v2/mma, 374800 bytes against its model's 408080), and the traffic check would fail a right copy.
function(flashlab_add_exercise target id dir)
  cmake_parse_arguments(PARSE_ARGV 3 arg "QUICK" "" "REUSE;CUDA")
  set(files ${arg_UNPARSED_ARGUMENTS})
  # The emulated libraries the exercise replaces; the kernels compiled from the workspace; and the objects of the
  # replaced libraries' other kernels, e.g. build/cuda_v2/CMakeFiles/flashlab_cuda_v2_emulated.dir/__/emulated/
  # cuda_v2/mma.cu.cpp.o when an exercise's lines are in split_q.cu only.
  set(replaced)
  set(kernels)
  set(kept_kernel_objects)
  get_property(libraries GLOBAL PROPERTY FLASHLAB_EMULATED_LIBRARIES)
  foreach(library ${libraries})
    get_target_property(library_files ${library} FLASHLAB_CUDA_FILES)
    set(copied)
    foreach(file ${arg_CUDA})
      if(file IN_LIST library_files)
        list(APPEND kernels ${file})
        string(REPLACE "." "\\." file_pattern ${file})
        list(APPEND copied "/emulated/${file_pattern}\\.cpp\\.o$")
      endif()
    endforeach()
    if(copied)
      list(APPEND replaced ${library})
      list(JOIN copied "|" copied_pattern)
      list(APPEND kept_kernel_objects "$<FILTER:$<TARGET_OBJECTS:${library}>,EXCLUDE,${copied_pattern}>")
    endif()
  endforeach()
  set(reused_objects)
  set(reused_stages)
  get_property(stages GLOBAL PROPERTY FLASHLAB_STAGES)
  foreach(file ${arg_REUSE})
    set(found FALSE)
    foreach(stage ${stages})
      get_target_property(stage_dir ${stage} SOURCE_DIR)
      get_target_property(stage_sources ${stage} SOURCES)
      file(RELATIVE_PATH folder ${PROJECT_SOURCE_DIR} ${stage_dir})
      get_filename_component(name ${file} NAME)
      if(folder STREQUAL "" OR NOT file STREQUAL "${folder}/${name}" OR NOT name IN_LIST stage_sources)
        continue()
      endif()
      get_target_property(stage_libraries ${stage} INTERFACE_LINK_LIBRARIES)
      set(calls_replaced FALSE)
      foreach(library ${replaced})
        if(library IN_LIST stage_libraries)
          set(calls_replaced TRUE)
        endif()
      endforeach()
      if(calls_replaced)  # its registration calls a replaced launcher: compiled from the workspace
        break()
      endif()
      # The object's path, e.g. build/naive/CMakeFiles/flashlab_naive.dir/./attention.cpp.o (Ninja adds the "./").
      string(REPLACE "." "\\." name_pattern ${name})
      list(APPEND reused_objects "$<FILTER:$<TARGET_OBJECTS:${stage}>,INCLUDE,/${stage}\\.dir/(\\./)?${name_pattern}\\.o$>")
      list(APPEND reused_stages ${stage})
      set(found TRUE)
      break()
    endforeach()
    if(NOT found)
      list(APPEND files ${file})
    endif()
  endforeach()
  list(TRANSFORM files PREPEND ${dir}/ OUTPUT_VARIABLE sources)
  list(REMOVE_DUPLICATES reused_stages)
  set(prefix_source ${PROJECT_BINARY_DIR}/exercises/${target}_prefix.cpp)
  file(WRITE ${prefix_source}
       "// Generated: registers this program's implementations as exercise/${id}/<name>.\n"
       "extern \"C\" const char* flashlab_registration_prefix() { return \"exercise/${id}/\"; }\n")
  if(kernels)
    list(TRANSFORM kernels PREPEND ${dir}/ OUTPUT_VARIABLE kernel_copies)
    flashlab_emulated_target(${target}_kernels OBJECT WRAPPERS ${PROJECT_BINARY_DIR}/exercises/${target}_kernels
                             ${kernel_copies})
    set_target_properties(${target}_kernels PROPERTIES EXCLUDE_FROM_ALL TRUE)
    target_include_directories(${target}_kernels BEFORE PRIVATE ${dir})
    target_compile_options(${target}_kernels PRIVATE -Wall -Wextra -Wno-missing-field-initializers
                                                     -Wno-maybe-uninitialized)
    if(arg_QUICK)
      target_compile_options(${target}_kernels PRIVATE -O1)
    endif()
  endif()
  _flashlab_exercise_program(${target} TRUE)
  # Where a GPU grades the copy too (FLASHLAB_EXERCISE_GPU, which ./flashlab exercise check sets on a machine
  # with one): ${target}_gpu, the same copy with its kernels also compiled by nvcc, with the options of the
  # stage's own GPU build. Its implementations run on the GPU where there is one, in the emulator elsewhere.
  if(kernels AND FLASHLAB_HAVE_CUDA AND FLASHLAB_EXERCISE_GPU)
    _flashlab_exercise_program(${target}_gpu FALSE)
    foreach(library ${replaced})
      get_target_property(library_files ${library} FLASHLAB_CUDA_FILES)
      get_target_property(options ${library} FLASHLAB_GPU_OPTIONS)
      list(TRANSFORM library_files PREPEND ${dir}/)
      add_library(${target}_gpu_${library} OBJECT EXCLUDE_FROM_ALL ${library_files})
      set_property(TARGET ${target}_gpu_${library} PROPERTY CUDA_ARCHITECTURES OFF)
      target_include_directories(${target}_gpu_${library} BEFORE PRIVATE ${dir})
      target_compile_options(${target}_gpu_${library} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${options}>)
      target_link_libraries(${target}_gpu_${library} PUBLIC flashlab_gpu_stage CUDA::cudart)
      target_link_libraries(${target}_gpu PRIVATE ${target}_gpu_${library})
    endforeach()
  endif()
endfunction()

# One program of an exercise (flashlab_add_exercise's variables): built for the emulator only, or also linking
# the copy's GPU build (added by the caller).
function(_flashlab_exercise_program program emulator_only)
  # Not part of `all`: a half-written copy must not break the build of everything else; ./flashlab exercise
  # check builds it by name.
  add_executable(${program} EXCLUDE_FROM_ALL ${sources} ${prefix_source} ${reused_objects})
  if(replaced)  # the replaced libraries' kernels that hold none of the exercise's lines
    target_sources(${program} PRIVATE ${kept_kernel_objects})
    add_dependencies(${program} ${replaced})
  endif()
  if(reused_stages)
    add_dependencies(${program} ${reused_stages})
    # What a reused object needs comes with it: e.g. decoding/cuda_split_kv.cpp's registration calls the CUDA
    # launcher in flashlab_decoding_cuda, which its stage links PUBLIC.
    foreach(stage ${reused_stages})
      get_target_property(stage_libraries ${stage} INTERFACE_LINK_LIBRARIES)
      if(stage_libraries)
        target_link_libraries(${program} PRIVATE ${stage_libraries})
      endif()
    endforeach()
  endif()
  # The workspace comes first on the include path, so the student's copies of the stage's headers are used.
  target_include_directories(${program} BEFORE PRIVATE ${dir})
  target_link_libraries(${program} PRIVATE flashlab_harness flashlab_common doctest::doctest)
  if(kernels)
    target_link_libraries(${program} PRIVATE ${target}_kernels flashlab_gpu_stage)
    if(emulator_only)
      target_compile_definitions(${program} PRIVATE FLASHLAB_EMULATOR_ONLY=1)
    endif()
  endif()
  # Warnings, but never -Werror: a half-written exercise must still build and be checked.
  target_compile_options(${program} PRIVATE -Wall -Wextra -Wno-missing-field-initializers -Wno-maybe-uninitialized)
  if(arg_QUICK)
    target_compile_options(${program} PRIVATE -O1)
  endif()
  set_target_properties(${program} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/exercises)
endfunction()

foreach(dir ${FLASHLAB_EXERCISE_DIRS})
  if(EXISTS ${dir}/exercise.cmake)
    include(${dir}/exercise.cmake)
  else()
    message(WARNING "exercise workspace ${dir} has no exercise.cmake: skipped")
  endif()
endforeach()
