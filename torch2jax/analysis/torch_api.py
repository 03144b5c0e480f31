"""Names of torch's API that several analyses read, as plain data: the repository's first pass
(repo.py) reads them without loading libcst, so that ``torch2jax check`` starts fast."""

from __future__ import annotations

# the packages whose import makes a file one to convert
TORCH_PACKAGES = ("torch", "torchvision")

# the global seeds a script sets (translated to one jax.random.key)
SEEDS = {"torch.manual_seed", "torch.random.manual_seed", "torch.seed"}
# the functions that draw from torch's global generator
RANDOM = {
    "torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.normal",
    "torch.bernoulli", "torch.multinomial", "torch.rand_like", "torch.randn_like",
    "torch.randint_like", "torch.poisson",
}
# tensors made on the spot that x.uniform_(...) / x.normal_(...) fill with a random draw
FILLED_NEW = {"torch.empty", "torch.zeros", "torch.ones", "torch.Tensor", "torch.FloatTensor",
              "torch.empty_like", "torch.zeros_like", "torch.ones_like"}
