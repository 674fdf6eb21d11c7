// NVRTC shim: <cfloat> onto libcu++.
#pragma once
#include <cuda/std/cfloat>
