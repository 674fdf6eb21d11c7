"""Small files in the real schemas of KernelBench and the Sakana archive, written by tests.

The problem modules are KernelBench-style (Model, get_inputs, get_init_inputs, module-level
sizes); the Sakana rows carry every archive column with a real .cu kernel and the matching
functional reference (``module_fn`` + ``Model.forward(..., fn=module_fn)``).
"""

from __future__ import annotations

from pathlib import Path

KERNELBENCH_PROBLEMS: dict[int, dict[str, str]] = {
    1: {
        "1_Square_matrix_multiplication_": '''import torch
import torch.nn as nn

class Model(nn.Module):
    """Performs a single square matrix multiplication (C = A * B)."""
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)

N = 2048

def get_inputs():
    A = torch.randn(N, N)
    B = torch.randn(N, N)
    return [A, B]

def get_init_inputs():
    return []
''',
        "19_ReLU": '''import torch
import torch.nn as nn

class Model(nn.Module):
    """Simple model that performs a ReLU activation."""
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)

batch_size = 16
dim = 16384

def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]

def get_init_inputs():
    return []
''',
    },
    2: {
        "12_Gemm_Multiply_LeakyReLU": '''import torch
import torch.nn as nn

class Model(nn.Module):
    """Simple model that performs a Gemm, multiplies the result, and applies LeakyReLU."""
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.leaky_relu = nn.LeakyReLU(negative_slope)

    def forward(self, x):
        x = self.gemm(x)
        x = x * self.multiplier
        x = self.leaky_relu(x)
        return x

batch_size = 128
in_features = 1024
out_features = 512
multiplier = 2.0
negative_slope = 0.1

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, multiplier, negative_slope]
''',
        "40_Matmul_Scaling_ResidualAdd": '''import torch
import torch.nn as nn

class Model(nn.Module):
    """A model that performs a matmul, scales the result and adds a residual."""
    def __init__(self, in_features, out_features, scaling_factor):
        super(Model, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.matmul(x)
        original_x = x.clone().detach()
        x = x * self.scaling_factor
        x = x + original_x
        return x

batch_size = 128
in_features = 64
out_features = 128
scaling_factor = 0.5

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, scaling_factor]
''',
    },
    3: {
        "1_MLP": """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super(Model, self).__init__()
        layers = []
        current_input_size = input_size
        for layer_size in layer_sizes:
            layers.append(nn.Linear(current_input_size, layer_size))
            layers.append(nn.ReLU())
            current_input_size = layer_size
        layers.append(nn.Linear(current_input_size, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        return self.network(x)

batch_size = 1
input_size = 1000
layer_sizes = [400, 800]
output_size = 500

def get_inputs():
    return [torch.randn(batch_size, input_size)]

def get_init_inputs():
    return [input_size, layer_sizes, output_size]
""",
        "2_ShallowWideMLP": """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, input_size, hidden_layer_sizes, output_size):
        super(Model, self).__init__()
        layers = []
        current_input_size = input_size
        for hidden_size in hidden_layer_sizes:
            layers.append(nn.Linear(current_input_size, hidden_size))
            layers.append(nn.ReLU())
            current_input_size = hidden_size
        layers.append(nn.Linear(current_input_size, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        return self.network(x)

batch_size = 1
input_size = 1000
hidden_layer_sizes = [2000, 2000]
output_size = 10

def get_inputs():
    return [torch.randn(batch_size, input_size)]

def get_init_inputs():
    return [input_size, hidden_layer_sizes, output_size]
""",
    },
}


def write_kernelbench_checkout(root: Path) -> Path:
    """A checkout layout: root/KernelBench/level<N>/<id>_<Name>.py; returns root."""
    for level, problems in KERNELBENCH_PROBLEMS.items():
        folder = root / "KernelBench" / f"level{level}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, code in problems.items():
            (folder / f"{name}.py").write_text(code)
    return root


def kernelbench_rows(level: int) -> dict[str, list]:
    names = list(KERNELBENCH_PROBLEMS[level])
    return {
        "code": [KERNELBENCH_PROBLEMS[level][n] for n in names],
        "level": [level] * len(names),
        "name": names,
        "problem_id": [int(n.split("_", 1)[0]) for n in names],
    }


def write_kernelbench_parquet(root: Path) -> Path:
    """The hub dataset's layout: root/data/level_<N>-00000-of-00001.parquet; returns root/data."""
    import datasets

    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    for level in KERNELBENCH_PROBLEMS:
        datasets.Dataset.from_dict(kernelbench_rows(level)).to_parquet(
            str(data / f"level_{level}-00000-of-00001.parquet")
        )
    return data


SAKANA_MODULE = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """Linear layer followed by a ReLU and a constant scale."""
    def __init__(self, in_features, out_features, scale):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.linear(x)) * self.scale

batch_size = 64
in_features = 128
out_features = 32
scale = 0.5

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, scale]
'''

SAKANA_FUNCTIONAL = '''import torch
import torch.nn as nn
import torch.nn.functional as F


def module_fn(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """Linear, ReLU, scale.

    Args:
        x: (batch_size, in_features)
        weight: (out_features, in_features)
        bias: (out_features,)
        scale: constant factor
    """
    return F.relu(F.linear(x, weight, bias)) * scale


class Model(nn.Module):
    """Linear layer followed by a ReLU and a constant scale."""

    def __init__(self, in_features, out_features, scale):
        super(Model, self).__init__()
        linear = nn.Linear(in_features, out_features)
        self.weight = nn.Parameter(linear.weight)
        self.bias = nn.Parameter(linear.bias)

    def forward(self, x, fn=module_fn):
        return fn(x, self.weight, self.bias, scale)


batch_size = 64
in_features = 128
out_features = 32
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
'''

SAKANA_CUDA_CORRECT = r"""#include <torch/extension.h>
#include <cuda.h>
#include <cuda_runtime.h>

// One thread per output element: y[b, o] = relu(sum_k x[b, k] * w[o, k] + bias[o]) * scale
__global__ void linear_relu_scale_kernel(const float* __restrict__ x,
                                         const float* __restrict__ w,
                                         const float* __restrict__ bias,
                                         float* __restrict__ y,
                                         int batch, int in_features, int out_features,
                                         float scale) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    int b = blockIdx.y;
    if (o >= out_features || b >= batch) return;
    float acc = bias[o];
    for (int k = 0; k < in_features; ++k) {
        acc += x[b * in_features + k] * w[o * in_features + k];
    }
    y[b * out_features + o] = fmaxf(acc, 0.0f) * scale;
}

torch::Tensor forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    const int batch = xc.size(0);
    const int in_features = xc.size(1);
    const int out_features = wc.size(0);
    auto y = torch::empty({batch, out_features}, xc.options());
    dim3 block(128);
    dim3 grid((out_features + block.x - 1) / block.x, batch);
    linear_relu_scale_kernel<<<grid, block>>>(xc.data_ptr<float>(), wc.data_ptr<float>(),
                                              bias.data_ptr<float>(), y.data_ptr<float>(),
                                              batch, in_features, out_features,
                                              static_cast<float>(scale));
    return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("forward", &forward, "Linear + ReLU + scale (CUDA)");
}
"""

# The archive also keeps failed attempts: this one forgets the bias.
SAKANA_CUDA_WRONG = SAKANA_CUDA_CORRECT.replace("float acc = bias[o];", "float acc = 0.0f;")

SAKANA_COLUMNS = (
    "Op_Name", "Level_ID", "Task_ID", "Kernel_Name", "CUDA_Runtime", "PyTorch_Native_Runtime",
    "PyTorch_Compile_Runtime", "CUDA_Speedup_Native", "CUDA_Speedup_Compile", "CUDA_Code",
    "PyTorch_Code_Module", "PyTorch_Code_Functional", "Correct", "Max_Diff", "Error",
    "NCU_Profile", "Torch_Profile", "Clang_Tidy", "__index_level_0__",
)  # fmt: skip


def sakana_rows() -> dict[str, list]:
    return {
        "Op_Name": ["76_Gemm_ReLU_Scale", "76_Gemm_ReLU_Scale"],
        "Level_ID": [2, 2],
        "Task_ID": [76, 76],
        "Kernel_Name": ["linear_relu_scale_base", "linear_relu_scale_nobias_edit_1"],
        "CUDA_Runtime": [0.021, None],
        "PyTorch_Native_Runtime": [0.034, 0.034],
        "PyTorch_Compile_Runtime": [0.052, 0.052],
        "CUDA_Speedup_Native": [1.619, None],
        "CUDA_Speedup_Compile": [2.476, None],
        "CUDA_Code": [SAKANA_CUDA_CORRECT, SAKANA_CUDA_WRONG],
        "PyTorch_Code_Module": [SAKANA_MODULE, SAKANA_MODULE],
        "PyTorch_Code_Functional": [SAKANA_FUNCTIONAL, SAKANA_FUNCTIONAL],
        "Correct": [True, False],
        "Max_Diff": [2.3e-06, 0.875],
        "Error": [None, "Output mismatch: max difference 0.875"],
        "NCU_Profile": ['{"linear_relu_scale_kernel": {"sm__throughput": 41.2}}', None],
        "Torch_Profile": ['{"aten::empty": {"cuda_time_us": 1.1}}', None],
        "Clang_Tidy": ["", ""],
        "__index_level_0__": [1203, 1204],
    }


def write_sakana_parquet(root: Path, rows: dict[str, list] | None = None) -> Path:
    """The archive's layout: root/level_2.parquet; returns the file."""
    import datasets

    root.mkdir(parents=True, exist_ok=True)
    path = root / "level_2.parquet"
    datasets.Dataset.from_dict(rows or sakana_rows()).to_parquet(str(path))
    return path
