# The Python module (python/, docs/python.md) is built where Python's development files and nanobind are found:
# ./flashlab installs the pinned nanobind into build/deps/ (the Debian package python3-dev gives the headers),
# and `pip install .` brings its own through pyproject.toml. FLASHLAB_PYTHON=ON makes a missing piece an error,
# OFF leaves the module out. The sanitizer build leaves it out: a Python interpreter would need AddressSanitizer's
# run-time preloaded.
#
# The module is a shared library holding every stage, so every object is compiled position-independent when it
# is built; -fno-semantic-interposition keeps the compiler's freedom to inline and specialize across functions
# as in a program (no symbol of ours is ever interposed).
set(FLASHLAB_PYTHON AUTO CACHE STRING "Build the Python module: AUTO (when Python's headers and nanobind are found), ON or OFF")
set_property(CACHE FLASHLAB_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(FLASHLAB_HAVE_PYTHON OFF)
if(NOT FLASHLAB_PYTHON STREQUAL "OFF" AND NOT FLASHLAB_SANITIZE)
  find_package(Python 3.9 COMPONENTS Interpreter Development.Module)
  if(Python_FOUND)
    # The pinned copy the driver installs, or the one pip's build environment has (scikit-build-core).
    execute_process(COMMAND ${Python_EXECUTABLE} -c "import nanobind; print(nanobind.cmake_dir())"
                    OUTPUT_VARIABLE nanobind_from_python OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    find_package(nanobind CONFIG QUIET
                 HINTS ${PROJECT_BINARY_DIR}/deps/nanobind/nanobind/cmake ${nanobind_from_python})
  endif()
  if(Python_FOUND AND nanobind_FOUND)
    set(FLASHLAB_HAVE_PYTHON ON)
    set(CMAKE_POSITION_INDEPENDENT_CODE ON)
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-semantic-interposition>)
    message(STATUS "flashlab: the Python module for ${Python_EXECUTABLE} (${Python_VERSION}), nanobind ${nanobind_VERSION}")
  elseif(FLASHLAB_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "FLASHLAB_PYTHON=ON but Python's development files or nanobind were not found")
  else()
    message(STATUS "flashlab: no Python module (Python's development files or nanobind not found; ./flashlab installs them)")
  endif()
endif()
