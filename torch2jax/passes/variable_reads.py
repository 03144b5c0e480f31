"""A parameter or buffer given to a jitted JAX function (NNX).

``jax.nn.sigmoid`` and most of ``jax.nn`` and ``jax.lax`` are ``jax.jit`` functions: given an
``nnx.Param`` or ``nnx.Variable`` itself they fail ("Triggering __jax_array__() during
abstractification is no longer supported"), where ``jnp``'s functions take one. So
``torch.sigmoid(self.alpha)`` and ``self.alpha.sigmoid()`` (timm's efficientvim) read the
array, ``jax.nn.sigmoid(self.alpha[...])``.
"""

from __future__ import annotations

import libcst as cst

from torch2jax.analysis.metadata import ParentNodeProvider

_JITTED = ("jax.nn.", "jax.lax.")


def given_to_jitted(rw, node: cst.Attribute) -> bool:
    """``node`` (``self.<variable>``, an original node) is an argument of a torch function,
    or the receiver of a tensor method, whose rule is a jitted JAX function."""
    parent = rw.get_metadata(ParentNodeProvider, node, None)
    outer = rw.get_metadata(ParentNodeProvider, parent, None) if isinstance(
        parent, (cst.Arg, cst.Attribute)) else None
    if not isinstance(outer, cst.Call):
        return False
    if isinstance(parent, cst.Arg):
        rule = rw.rules.functions.get(rw.q(outer.func) or "")
    elif outer.func is parent and parent.value is node:
        rule = rw.rules.methods.get(parent.attr.value)
    else:
        return False
    return rule is not None and (rule.jax or "").startswith(_JITTED)
