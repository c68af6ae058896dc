// In emulated builds, the emulator's stand-in for NVIDIA's cudaTypedefs.h (emulator/cuda.hpp).
#pragma once

#include "emulator/cuda.hpp"
