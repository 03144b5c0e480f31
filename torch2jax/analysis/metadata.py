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

from contextlib import ExitStack
from types import MappingProxyType

import libcst as cst
from libcst import MetadataException, visit_batched
from libcst import metadata as libcst_metadata
from libcst.metadata import BatchableMetadataProvider, CodeRange, MetadataWrapper, ScopeProvider

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


class FileMetadata(MetadataWrapper):
    """A ``MetadataWrapper`` over a parsed module (not copied) that resolves providers in
    libcst's rounds but without its traversals where they do nothing: a round whose
    batchable providers only have ``visit_Module`` / ``leave_Module`` (all of those above,
    and libcst's scope and expression-context providers) calls them on the module instead
    of walking the tree to find no other node to call them on. Other rounds run as in
    libcst."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(module, unsafe_skip_copy=True)

    def resolve_many(self, providers):
        completed = set(self._metadata)
        remaining = _with_dependencies(set(providers)) - completed
        while remaining:
            ready = {P for P in remaining if set(P.METADATA_DEPENDENCIES) <= completed}
            if not ready:
                names = ", ".join(P.__name__ for P in remaining)
                raise MetadataException(f"circular metadata dependencies: {names}")
            batch = []
            for P in ready:
                provider = P(self._cache.get(P)) if P.gen_cache else P()
                if isinstance(provider, BatchableMetadataProvider):
                    batch.append(provider)
                else:
                    self._metadata[P] = provider._gen(self)
            if batch:
                self._run_batch(batch)
            completed |= ready
            remaining -= ready
        return {k: self._metadata[k] for k in providers}

    def _run_batch(self, batch: list[BatchableMetadataProvider]) -> None:
        methods: dict[str, list] = {}
        for provider in batch:
            for name, fn in provider.get_visitors().items():
                methods.setdefault(name, []).append(fn)
        with ExitStack() as stack:
            for provider in batch:
                stack.enter_context(provider.resolve(self))
            if set(methods) <= {"visit_Module", "leave_Module"}:
                for fn in methods.get("visit_Module", []):
                    fn(self.module)
                for fn in methods.get("leave_Module", []):
                    fn(self.module)
            else:
                visit_batched(self.module, batch)
        for provider in batch:
            self._metadata[type(provider)] = MappingProxyType(dict(provider._computed))


def _with_dependencies(providers: set) -> set:
    out: set = set()
    todo = list(providers)
    while todo:
        P = todo.pop()
        if P not in out:
            out.add(P)
            todo.extend(P.METADATA_DEPENDENCIES)
    return out
