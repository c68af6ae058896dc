// FLASHLAB_HOST_DEVICE: marks the few shared functions (the mask band, the softmax state) that the CUDA
// stages call from device code too, so that each piece of math has one definition for host and device.
#pragma once

#if defined(__CUDACC__)
#define FLASHLAB_HOST_DEVICE __host__ __device__
#else
#define FLASHLAB_HOST_DEVICE
#endif
