// NVRTC shim: <climits> onto libcu++.
#pragma once
#include <cuda/std/climits>
