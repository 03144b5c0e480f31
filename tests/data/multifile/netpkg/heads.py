from torch import nn

from .layers import Mlp


class Head(Mlp):
    """A module class whose base is defined in another file of the package; its forward is
    Mlp's."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__(dim, classes)
        self.drop = nn.Dropout(0.1)
