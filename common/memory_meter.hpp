// Peak heap memory, measured: the tool and the benchmarks link an interposer over malloc and free
// (memory_meter.cpp) that counts the bytes in use, so "extra memory" is what an implementation really
// allocated, Eigen temporaries and OpenMP buffers included. Programs without the interposer (the sanitizer
// build) report it as inactive.
#pragma once

#include <cstdint>

namespace flashlab::memory_meter {

bool active();
int64_t in_use();   // heap bytes in use now
int64_t peak();     // the most in use since the last reset_peak()
void reset_peak();  // starts a new measurement from the current level

}  // namespace flashlab::memory_meter
