"""Which random draws belong on the host: the batch indices of the input pipeline.

``perm = torch.randperm(n)`` then ``idx = perm[i * B:(i + 1) * B]; xb = x[idx]``, or nanoGPT's
``ix = torch.randint(len(data) - block_size, (batch_size,))`` then
``torch.stack([data[i:i + block_size] for i in ix])``: the drawn values are only ever used to
index. Drawn on the device with ``jax.random`` they cost a dispatch and a device round trip per
batch, and a Python loop over device scalars; drawn with numpy they cost microseconds. Such a
draw is host-side when its value only reaches subscripts: it is used as an index (``x[ix]``,
``data[i:i + n]``), sliced into another name that is itself host-side, or iterated by a loop
whose variable is. Everything else (data, noise, dropout masks, anything that reaches a model
or arithmetic whose result is kept) keeps a JAX key.

The host draws come from one ``numpy.random.Generator`` seeded from the script's seed: the
argument of its one ``torch.manual_seed`` when that is a literal or a module-level constant.
A script seeded in another way (``torch.manual_seed(args.seed)``, several seeds) keeps
``jax.random`` for every draw.
"""

from __future__ import annotations

import libcst as cst
from libcst.metadata import ScopeProvider

from torch2jax.analysis.metadata import ParentNodeProvider

HOST_DRAWS = frozenset({"torch.randint", "torch.randperm"})
SEEDS = frozenset({"torch.manual_seed", "torch.random.manual_seed"})
GENERATOR = "host_rng"
def stacked_slices(original: cst.Call, node: cst.Call, host: HostDraws
                   ) -> cst.BaseExpression | None:
    """``torch.stack([data[i:i + n] for i in ix])`` over host-side indices ``ix`` (the
    updated call, its function already translated): one gather,
    ``jnp.take(data, ix[:, None] + np.arange(n), axis=0)``, instead of a device slice per row. None for any
    other shape."""
    if len(node.args) != 1 or node.args[0].keyword is not None or not isinstance(
            node.args[0].value, cst.ListComp):
        return None
    if not (original.args and isinstance(original.args[0].value, cst.ListComp)
            and id(original.args[0].value.for_in) in host.loops):
        return None
    comp = node.args[0].value
    loop = comp.for_in
    if loop.inner_for_in is not None or loop.ifs or not isinstance(loop.target, cst.Name) \
            or not isinstance(loop.iter, cst.Name):
        return None
    elt = comp.elt
    if not (isinstance(elt, cst.Subscript) and len(elt.slice) == 1 and isinstance(
            elt.slice[0].slice, cst.Slice)):
        return None
    sl = elt.slice[0].slice
    if sl.lower is None or sl.step is not None or not (isinstance(
            sl.upper, cst.BinaryOperation) and isinstance(sl.upper.operator, cst.Add)
            and sl.upper.left.deep_equals(sl.lower)):
        return None
    i, ix, n = loop.target.value, loop.iter, sl.upper.right

    class _Rows(cst.CSTTransformer):
        def leave_Name(self, original_node, updated_node):
            return ix if updated_node.value == i else updated_node

    uses = [x for x in _names(elt.value) | _names(n) if x == i]
    if uses:
        return None  # the sliced array or the length depends on the row
    start = sl.lower.visit(_Rows())
    if not isinstance(start, cst.Name):
        start = start.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    index = cst.parse_expression("s[:, None] + np.arange(n)")
    index = index.with_changes(left=index.left.with_changes(value=start), right=index.right
                               .with_changes(args=[cst.Arg(n)]))
    # jnp.take: one gather (indexing a jax array with an array index dispatches several ops)
    return cst.Call(func=cst.parse_expression("jnp.take"), args=[
        cst.Arg(elt.value), cst.Arg(index), cst.Arg(cst.Integer("0"), keyword=cst.Name("axis"),
                                                    equal=cst.AssignEqual(
                                                        cst.SimpleWhitespace(""),
                                                        cst.SimpleWhitespace("")))])


def _names(node: cst.CSTNode) -> set[str]:
    found: set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            found.add(n.value)

    node.visit(_V())
    return found


# expression nodes through which a name stays an index: ix + 1, i:i + n, (ix,), -ix
_INDEX_EXPR = (cst.BinaryOperation, cst.UnaryOperation, cst.Index, cst.Slice,
               cst.Tuple, cst.Element)


class HostDraws:
    """``draws``: ids of the host-side draw calls; ``seed``: the generator's seed (source)."""

    def __init__(self, draws: set[int], seed: cst.BaseExpression | None,
                 after: cst.CSTNode | None, loops: set[int] | None = None) -> None:
        self.draws = draws
        self.loops = loops or set()  # ids of the For / CompFor nodes over host-side indices
        self.seed = seed
        self.after = after  # the module-level statement that binds the seed (None: a literal)


def find_host_draws(wrapper: cst.MetadataWrapper) -> HostDraws:
    scopes = wrapper.resolve(ScopeProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    module = wrapper.module

    def q(node: cst.CSTNode) -> str | None:
        scope = scopes.get(node)
        names = scope.get_qualified_names_for(node) if scope is not None else None
        return min(n.name for n in names) if names else None

    calls: list[cst.Call] = []
    seeds: list[cst.Call] = []

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            name = q(node.func)
            if name in HOST_DRAWS:
                calls.append(node)
            elif name in SEEDS:
                seeds.append(node)

    module.visit(_Calls())
    none = HostDraws(set(), None, None)
    if not calls:
        return none
    for scope in {s for s in scopes.values() if s is not None}:
        if GENERATOR in scope.assignments or GENERATOR in scope.accesses:
            return none
    seed, after = _seed(seeds, scopes, parents, module)
    if seed is None:
        return none

    def assignment_of(target: cst.Name):
        scope = scopes.get(target)
        if scope is None:
            return None
        for a in scope.assignments[target.value]:
            if getattr(a, "node", None) is target:
                return a
        return None

    def only_indexes(target: cst.Name, depth: int = 0) -> bool:
        """Every read of the name ``target`` binds is an index (or leads only to indices)."""
        if depth > 4:
            return False
        scope = scopes.get(target)
        if scope is None or len(scope.assignments[target.value]) != 1:
            return False  # rebound elsewhere: the reads may see another value
        a = assignment_of(target)
        if a is None or not a.references:
            return False
        return all(_index_use(ref.node, depth) for ref in a.references)

    def _index_use(node: cst.CSTNode, depth: int) -> bool:
        parent = parents.get(node)
        if isinstance(parent, cst.Subscript) and parent.value is node:
            # perm[a:b]: the slice is bound to a name, or used as an index itself
            holder = parents.get(parent)
            if isinstance(holder, cst.Assign) and len(holder.targets) == 1 and isinstance(
                    holder.targets[0].target, cst.Name):
                return only_indexes(holder.targets[0].target, depth + 1)
            return _inside_index(parent)
        if isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is node:
            if isinstance(parent.target, cst.Name) and only_indexes(parent.target, depth + 1):
                loops.add(id(parent))
                return True
            return False
        return _inside_index(node)

    def _inside_index(node: cst.CSTNode) -> bool:
        child, parent = node, parents.get(node)
        while isinstance(parent, _INDEX_EXPR):
            child, parent = parent, parents.get(parent)
        return isinstance(parent, cst.SubscriptElement) and child is parent.slice

    draws: set[int] = set()
    loops: set[int] = set()
    for c in calls:
        if any(a.keyword is not None and a.keyword.value in ("generator", "out", "device")
               for a in c.args):
            continue
        holder = parents.get(c)
        if isinstance(holder, cst.Assign) and len(holder.targets) == 1 and isinstance(
                holder.targets[0].target, cst.Name) and only_indexes(holder.targets[0].target):
            draws.add(id(c))
    return HostDraws(draws, seed, after, loops) if draws else none


def _seed(seeds, scopes, parents, module):
    """(the seed expression, the module-level statement binding it) of the script's one
    ``torch.manual_seed``; (0, None) without one; (None, None) when it is not a literal or a
    module-level constant."""
    if not seeds:
        return cst.Integer("0"), None
    texts = {module.code_for_node(s.args[0].value) for s in seeds if s.args}
    if len(texts) != 1 or any(len(s.args) != 1 for s in seeds):
        return None, None
    value = seeds[0].args[0].value
    if isinstance(value, cst.Integer):
        return value, None
    if not isinstance(value, cst.Name):
        return None, None
    scope = scopes.get(value)
    found = None
    for s in seeds:
        sc = scopes.get(s)
        refs = [a for a in (sc.accesses[value.value] if sc is not None else ())
                if a.node is s.args[0].value]
        for acc in refs:
            for a in acc.referents:
                node = getattr(a, "node", None)
                if node is None or getattr(a, "scope", None) is None or (
                        a.scope is not a.scope.globals):
                    return None, None
                found = node
    if found is None or scope is None:
        return None, None
    stmt = found
    while stmt is not None and not isinstance(stmt, cst.SimpleStatementLine):
        stmt = parents.get(stmt)
    if stmt is None or not any(b is stmt for b in module.body):
        return None, None
    return value, stmt
