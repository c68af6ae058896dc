// Device memory in the emulator (internal to emulator/): host allocations that cudaMalloc hands out and
// kernels may access, with guard bands around each so that an access just past the end is caught.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashlab::emulator {

// cudaMalloc and cudaFree. New memory is poisoned (0xff bytes: NaN in every float format), as cudaMalloc's
// contents are undefined. allocate() returns nullptr when the host has no memory left.
void* device_allocate(size_t bytes);
bool device_free(void* pointer);  // false when `pointer` is not the start of an allocation

// Whether [address, address + bytes) lies inside one allocation.
bool is_device_range(const void* address, size_t bytes);
// Where `address` is relative to the nearest allocation, for messages: "8 bytes after the end of the
// 4096-byte allocation at 0x7f..." (0 bytes after: the first byte past it).
std::string describe_device_address(uintptr_t address);

// What a kernel's access to an address outside its block's shared memory and its stack is: inside an
// allocation, inside the launch's parameters or the program's read-only data (loads only), or in the
// thread-local block that holds static __shared__ variables; "" when allowed, else why not.
std::string check_global_access(uintptr_t address, size_t bytes, bool write, const void* parameters,
                                size_t parameter_bytes);

}  // namespace flashlab::emulator
