"""The top model of a small multi-file package: it subclasses a module class of the package
(re-exported by netpkg/__init__.py) and builds a head defined in another file."""

import torch
from torch import nn

from netpkg import Backbone
from netpkg.heads import Head as H


class Classifier(Backbone):
    def __init__(self, dim: int = 16, classes: int = 4) -> None:
        super().__init__(dim)
        self.head = H(dim, classes)
        self.scale = nn.Parameter(torch.ones(classes))

    def forward(self, x):
        return self.head(self.features(x)) * self.scale
