// The emulated half of common/cuda/launch.cuh: a kernel and its arguments become an emulator::Launch.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emulator/cuda.hpp"
#include "emulator/launch.hpp"

namespace flashlab::emulator {

// "split_q_kernel<__half, 64>" from this function's signature as GCC spells it: the kernel's name without its
// namespaces, with its template arguments (whose namespaces are dropped too).
std::string kernel_name(std::string_view pretty_function);

template <auto Kernel, typename... Args>
void launch_kernel(cuda_api::dim3 grid, cuda_api::dim3 block, size_t dynamic_shared_bytes, Args&&... args) {
  // The arguments are copied once, as a launch copies them into the parameter space; each thread's call
  // copies them again into its own parameters.
  using Arguments = std::tuple<std::decay_t<Args>...>;
  const Arguments arguments(std::forward<Args>(args)...);
  Launch launch;
  launch.kernel = kernel_name(__PRETTY_FUNCTION__);
  launch.kernel_address = reinterpret_cast<const void*>(Kernel);
  launch.grid = {grid.x, grid.y, grid.z};
  launch.block = {block.x, block.y, block.z};
  launch.dynamic_shared_bytes = dynamic_shared_bytes;
  launch.body = [](const void* parameters) {
    std::apply([](const auto&... values) { Kernel(values...); }, *static_cast<const Arguments*>(parameters));
  };
  launch.parameters = &arguments;
  launch.parameter_bytes = sizeof(arguments);
  run(launch);
}

}  // namespace flashlab::emulator
