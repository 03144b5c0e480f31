"""The metadata the converter's visitors read, resolved in as few passes over the tree as
libcst allows.

libcst resolves providers in rounds: each round visits the whole tree once for the batchable
providers of that round (even when there are none), and each provider then does its own work,
for most of them another visit. Three of the four providers the converter used cost more
than their data:

* ``ParentNodeProvider`` visits the tree and asks every node for its ``children``, which
  copies the node again. :class:`ParentNodeProvider` builds the same mapping from one
  :func:`~torch2jax.analysis.walk.walk_up`. A node a rewrite put in two places gets the
  parent libcst records: that of the occurrence left last.
* ``QualifiedNameProvider`` visits the tree to store, for every node, a lazy call of its
  scope's ``get_qualified_names_for``. :func:`~torch2jax.analysis.index.qualified` makes that
  call itself from ``ScopeProvider``, the same answer, with no round and no visit.
* ``PositionProvider`` is not batchable, so it costs a round of its own. The
  :class:`PositionProvider` here runs libcst's own computation, batched with the others.

With these, :data:`ALL` resolves in two rounds: {expression contexts, parents, positions},
then {scopes}.
"""

from __future__ import annotations

import libcst as cst
from libcst import metadata as libcst_metadata
from libcst.metadata import BatchableMetadataProvider, CodeRange, ScopeProvider

from torch2jax.analysis.walk import walk_up


class ParentNodeProvider(BatchableMetadataProvider[cst.CSTNode]):
    """``libcst.metadata.ParentNodeProvider``'s mapping: each node's parent."""

    def visit_Module(self, node: cst.Module) -> None:
        computed = self._computed
        for parent, kids in walk_up(node):
            for child in kids:
                computed[child] = parent


class PositionProvider(BatchableMetadataProvider[CodeRange]):
    """``libcst.metadata.PositionProvider``'s mapping (its computation), batchable."""

    def visit_Module(self, node: cst.Module) -> None:
        positions = libcst_metadata.PositionProvider()
        positions._computed = self._computed  # it fills this provider's mapping
        positions._gen_impl(node)


ALL = (ScopeProvider, ParentNodeProvider, PositionProvider)
