// cudaStream_t without the CUDA headers, for the plain C++ headers that name it: the CUDA runtime and the
// emulator (emulator/cuda.hpp) both declare it as exactly this pointer type.
#pragma once

typedef struct CUstream_st* cudaStream_t;
