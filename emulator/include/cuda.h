// In emulated builds, the emulator's stand-in for NVIDIA's cuda.h (emulator/cuda.hpp).
#pragma once

#include "emulator/cuda.hpp"
