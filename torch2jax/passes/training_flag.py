"""Which module class sets NNX's ``self.deterministic`` (torch's ``self.training``) in its
``__init__``.

A class that reads ``self.training`` sets it; so does a class whose subclass of the file reads
it without an ``__init__`` of its own (timm's ``RotaryEmbeddingCat(_RotaryEmbeddingBase)``,
whose ``get_embed`` reads ``self.training`` and whose ``__init__`` is the base's): the
subclass's modules are built by the base's ``__init__`` (it was "'RotaryEmbeddingCat' object
has no attribute 'deterministic'").
"""

from __future__ import annotations


def sets_training_flag(classes: dict, name: str, info) -> bool:
    """Whether class ``name`` (its index entry ``info``; ``classes``: the file's) sets the
    flag: it reads ``self.training``, or a subclass built by its ``__init__`` does."""
    if info.uses_training:
        return True
    for cls in classes.values():
        if not cls.uses_training:
            continue
        c, seen = cls, set()
        while not c.defines_init and c.module_base in classes and c.name not in seen:
            seen.add(c.name)
            c = classes[c.module_base]
            if c.name == name:
                return True
    return False
