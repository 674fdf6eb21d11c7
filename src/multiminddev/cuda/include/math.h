// NVRTC shim: CUDA's math functions are built in; <cmath> only needs to exist.
#pragma once
