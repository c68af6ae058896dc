// In emulated builds, the emulator's stand-in for NVIDIA's cuda_bf16.h (emulator/cuda.hpp).
#pragma once

#include "emulator/cuda.hpp"
