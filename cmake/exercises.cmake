# Course exercises: each workspace written by `./flashlab exercise start` (tools/exercise.py) holds a student's copy
# of one stage and an exercise.cmake that calls flashlab_add_exercise(). The program links the shared harness to that
# copy (not to the real stage) and registers its implementations as "exercise/ID/<name>".
set(FLASHLAB_EXERCISE_DIRS "" CACHE STRING "Exercise workspaces to build (maintained by ./flashlab exercise)")

function(flashlab_add_exercise target id dir)
  list(TRANSFORM ARGN PREPEND ${dir}/ OUTPUT_VARIABLE sources)
  set(prefix_source ${PROJECT_BINARY_DIR}/exercises/${target}_prefix.cpp)
  file(WRITE ${prefix_source}
       "// Generated: registers this program's implementations as exercise/${id}/<name>.\n"
       "extern \"C\" const char* flashlab_registration_prefix() { return \"exercise/${id}/\"; }\n")
  add_executable(${target} ${sources} ${prefix_source})
  # The workspace comes first on the include path, so the student's copies of the stage's headers are used.
  target_include_directories(${target} BEFORE PRIVATE ${dir})
  target_link_libraries(${target} PRIVATE flashlab_harness flashlab_common doctest::doctest)
  # Warnings, but never -Werror: a half-written exercise must still build and be checked.
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-missing-field-initializers -Wno-maybe-uninitialized)
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/exercises)
endfunction()

foreach(dir ${FLASHLAB_EXERCISE_DIRS})
  if(EXISTS ${dir}/exercise.cmake)
    include(${dir}/exercise.cmake)
  else()
    message(WARNING "exercise workspace ${dir} has no exercise.cmake: skipped")
  endif()
endforeach()
