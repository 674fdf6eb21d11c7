// NVRTC shim: kernels written for nvcc include <cuda_runtime.h>; under NVRTC the device
// built-ins are already declared, so the header only needs to exist.
#pragma once
