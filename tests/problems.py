"""Small problem sources shared by tests of several packages."""

# A relu over 1024 elements: cheap to evaluate, so trainer, rollout, prompt and profile tests
# use it where any problem will do.
RELU_1024 = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(1024)]
def get_init_inputs():
    return []
'''
