# A course handout (`./flashlab exercise handout`, tools/exercise.py) is this project with every exercise region
# holding its skeleton: a TODO where the lines go. Its stages still build, but a stage whose regions hold a TODO
# cannot pass its checks, so a handout's own `./flashlab test` and `compare` report it instead of running it:
# - its implementations are unavailable, with the reason "exercise not done: IDS" (common/registry.cpp), which
#   `list`, `compare` and the harness's registry loops show as for any other unavailable implementation;
# - the harness leaves out its sources that use such a stage directly (FLASHLAB_NOT_DONE_TEST_FILTER);
# - each exercise not done is a test of its own, reported as skipped (tests/CMakeLists.txt).
# An exercise counts as done once each of its regions in the stage holds code: the student's lines, pasted from
# their workspace (exercises/ID/). Editing a region's file reconfigures. Outside a handout nothing changes, and
# nothing is scanned.

# The strings of the JSON array at the path ARGN of `json`, as a list in `out`.
function(flashlab_json_array out json)
  string(JSON count LENGTH "${json}" ${ARGN})
  set(items "")
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(n RANGE ${last})
      string(JSON item GET "${json}" ${ARGN} ${n})
      list(APPEND items "${item}")
    endforeach()
  endif()
  set(${out} "${items}" PARENT_SCOPE)
endfunction()

set(FLASHLAB_HANDOUT OFF)
set(FLASHLAB_EXERCISES_NOT_DONE "")    # ids
set(FLASHLAB_NOT_DONE_TEST_FILTER "")  # doctest's --source-file-exclude=..., or empty
set(flashlab_not_done_table "")        # the entries of unfinished_stages() (common/registry.hpp)
if(EXISTS ${PROJECT_SOURCE_DIR}/HANDOUT.md)
  set(FLASHLAB_HANDOUT ON)
  find_package(Python3 REQUIRED COMPONENTS Interpreter)
  execute_process(COMMAND ${Python3_EXECUTABLE} ${PROJECT_SOURCE_DIR}/tools/exercise.py not-done
                  OUTPUT_VARIABLE not_done ERROR_VARIABLE error RESULT_VARIABLE status)
  if(NOT status EQUAL 0)
    message(FATAL_ERROR "flashlab: tools/exercise.py not-done failed: ${error}")
  endif()
  flashlab_json_array(watch "${not_done}" watch)
  foreach(path ${watch})
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${path})
  endforeach()
  string(JSON count LENGTH "${not_done}" not_done)
  if(count GREATER 0)
    math(EXPR last "${count} - 1")
    foreach(n RANGE ${last})
      string(JSON stage MEMBER "${not_done}" not_done ${n})
      flashlab_json_array(ids "${not_done}" not_done ${stage})
      list(APPEND FLASHLAB_EXERCISES_NOT_DONE ${ids})
      list(JOIN ids ", " ids)
      string(APPEND flashlab_not_done_table "    {\"${stage}\", \"${ids}\"},\n")
    endforeach()
    list(JOIN FLASHLAB_EXERCISES_NOT_DONE ", " all)
    message(STATUS "flashlab: a handout; exercises not done: ${all}")
  endif()
  flashlab_json_array(test_files "${not_done}" test_files)
  if(test_files)
    list(TRANSFORM test_files PREPEND "*/")
    list(JOIN test_files "," patterns)
    set(FLASHLAB_NOT_DONE_TEST_FILTER "--source-file-exclude=${patterns}")
  endif()
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/unfinished_stages.cpp.in
               ${PROJECT_BINARY_DIR}/generated/unfinished_stages.cpp @ONLY)

# Tests that run stages through the tool or a script, not the harness (which leaves out what it cannot run): in a
# handout with an exercise not done they are not run (ctest lists them as disabled). Call it in the directory that
# adds the tests.
function(flashlab_needs_finished_exercises)
  if(FLASHLAB_EXERCISES_NOT_DONE)
    set_tests_properties(${ARGN} PROPERTIES DISABLED TRUE)
  endif()
endfunction()
