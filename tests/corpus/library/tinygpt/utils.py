"""Small helpers: a seed setter and a nested attribute-style config object."""

import random

import torch


def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)


class CfgNode:
    """A config whose entries are attributes; entries can be nested CfgNodes."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def __str__(self):
        return "\n".join(f"{k}: {v}" for k, v in self.__dict__.items())

    def to_dict(self):
        return {k: v.to_dict() if isinstance(v, CfgNode) else v for k, v in self.__dict__.items()}

    def merge_from_dict(self, d):
        self.__dict__.update(d)
