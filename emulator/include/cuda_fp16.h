// In emulated builds, the emulator's stand-in for NVIDIA's cuda_fp16.h (emulator/cuda.hpp).
#pragma once

#include "emulator/cuda.hpp"
