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

The array such indices gather from stays on the host too when nothing else reads it: a
``torch.tensor(..., dtype=...)`` whose every read is a gather of host-side rows
(``torch.stack([data[i:i + n] for i in ix])``), its length or shape, or the source of another
such name (``data = data.to(device)``, ``train_data = data[:n]``, ``d = train_data if split ==
"train" else val_data``) becomes a numpy array, and the gather a numpy index: the batch is
then a numpy array that the jitted step takes as an argument, as a hand-written JAX input
pipeline has it.

The host draws come from one ``numpy.random.Generator`` seeded from the script's seed: the
argument of its one ``torch.manual_seed`` when that is a literal or a module-level constant.
A script seeded in another way (``torch.manual_seed(args.seed)``, several seeds) keeps
``jax.random`` for every draw.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m
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
    if sl.lower is None or sl.upper is None or sl.step is not None:
        return None
    n = _length(sl.lower, sl.upper)
    if n is None:
        return None
    i, ix = loop.target.value, loop.iter

    class _Rows(cst.CSTTransformer):
        def leave_Name(self, original_node, updated_node):
            return ix if updated_node.value == i else updated_node

    uses = [x for x in _names(elt.value) | _names(n) if x == i]
    if uses:
        return None  # the sliced array or the length depends on the row
    on_host = id(original.args[0].value.elt.value) in host.gathers
    start = sl.lower.visit(_Rows())
    if not isinstance(start, cst.Name):
        start = start.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    index = cst.parse_expression("s[:, None] + np.arange(n)")
    index = index.with_changes(left=index.left.with_changes(value=start), right=index.right
                               .with_changes(args=[cst.Arg(n)]))
    if on_host:  # a numpy array (host arrays, module docstring): a numpy gather
        return cst.Subscript(value=elt.value, slice=[cst.SubscriptElement(cst.Index(index))])
    # jnp.take: one gather (indexing a jax array with an array index dispatches several ops)
    return cst.Call(func=cst.parse_expression("jnp.take"), args=[
        cst.Arg(elt.value), cst.Arg(index), cst.Arg(cst.Integer("0"), keyword=cst.Name("axis"),
                                                    equal=cst.AssignEqual(
                                                        cst.SimpleWhitespace(""),
                                                        cst.SimpleWhitespace("")))])


def _terms(node: cst.BaseExpression) -> tuple[list[cst.BaseExpression], int]:
    """A sum ``a + b + 2``: its non-literal terms and the sum of its integer literals."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add) \
            and not node.lpar:
        left, cl = _terms(node.left)
        right, cr = _terms(node.right)
        return left + right, cl + cr
    if isinstance(node, cst.Integer):
        return [], int(node.value)
    return [node], 0


def _length(lower: cst.BaseExpression, upper: cst.BaseExpression) -> cst.BaseExpression | None:
    """``upper - lower`` when it is free of ``lower``'s terms: ``i:i + n`` -> ``n``,
    ``i + 1:i + n + 1`` -> ``n``, ``i + 1:i + 9`` -> ``8``; None otherwise."""
    low, c_low = _terms(lower)
    up, c_up = _terms(upper)
    rest = list(up)
    for t in low:
        hit = next((k for k, u in enumerate(rest) if u.deep_equals(t)), None)
        if hit is None:
            return None
        del rest[hit]
    if not rest and c_up - c_low <= 0:
        return None
    const = c_up - c_low
    if const < 0:
        return None  # (a + n - 1: not written so)
    if not rest:
        return cst.Integer(str(const))
    out = rest[0]
    for t in rest[1:]:
        out = cst.BinaryOperation(out, cst.Add(), t)
    if const:
        out = cst.BinaryOperation(out, cst.Add(), cst.Integer(str(const)))
    return out


def numpy_array(node: cst.BaseExpression) -> cst.BaseExpression:
    """The translated ``jnp.asarray(x, dtype=jnp.T)`` of a host array's ``torch.tensor`` as
    ``np.asarray(x, dtype=np.T)``: the same values and dtype, kept on the host."""
    if not m.matches(node, m.Call(func=m.Attribute(value=m.Name("jnp"), attr=m.Name("asarray")),
                                  args=[m.Arg(keyword=None), m.Arg(
                                      keyword=m.Name("dtype"),
                                      value=m.Attribute(value=m.Name("jnp")))])):
        return node
    dtype = node.args[1].value
    return node.with_changes(func=node.func.with_changes(value=cst.Name("np")), args=[
        node.args[0], node.args[1].with_changes(value=dtype.with_changes(value=cst.Name("np")))])


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
                 after: cst.CSTNode | None, loops: set[int] | None = None,
                 arrays: set[int] | None = None, gathers: set[int] | None = None) -> None:
        self.draws = draws
        self.loops = loops or set()  # ids of the For / CompFor nodes over host-side indices
        self.arrays = arrays or set()  # ids of the torch.tensor calls that become numpy
        self.gathers = gathers or set()  # ids of the Names of host arrays gathered by rows
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
    if not draws:
        return none
    arrays, gathers = _host_arrays(module, scopes, parents, loops, q)
    return HostDraws(draws, seed, after, loops, arrays, gathers)


# the dtypes of a torch.tensor that can become a numpy array of the same JAX dtype
_ARRAY_DTYPES = frozenset(f"torch.{d}" for d in (
    "long", "int64", "int", "int32", "int16", "int8", "uint8", "float", "float32", "half",
    "float16", "bool"))
_MOVES = frozenset({"to", "cuda", "cpu"})
_METADATA = frozenset({"shape", "size", "numel", "dim", "ndim", "ndimension", "dtype"})


def _host_arrays(module, scopes, parents, loops: set[int], q) -> tuple[set[int], set[int]]:
    """(ids of the ``torch.tensor`` calls, ids of the gathered Names) of the arrays that only
    feed host-side gathers (module docstring)."""
    if not loops:
        return set(), set()
    # every single-name assignment: (scope, name) -> [(kind, value, sources)]
    binds: dict[tuple, list[tuple[str, cst.BaseExpression, list[cst.Name]]]] = {}
    targets: set[int] = set()

    class _Assigns(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
                return
            target = node.targets[0].target
            scope = scopes.get(target)
            if scope is None:
                return
            targets.add(id(target))
            binds.setdefault((scope, target.value), []).append(_binding(node.value, q))

    module.visit(_Assigns())
    keys: dict[tuple, bool] = {}
    for key, found in binds.items():
        scope, name = key
        every = scope.assignments[name]
        if any(id(getattr(a, "node", None)) not in targets or a.scope is not scope
               for a in every):
            continue  # also bound by a loop, a parameter, an import, a global statement...
        if all(kind != "other" for kind, _, _ in found):
            keys[key] = True  # (a derived name stays while its sources are host arrays)
    # every read of a candidate: (key, kind, the key it feeds)
    reads: list[tuple[tuple, cst.Name, str, tuple | None]] = []
    source_of: dict[int, tuple] = {}  # id(source Name) -> the key its binding assigns
    for key, found in binds.items():
        for _, _, sources in found:
            for src in sources:
                source_of[id(src)] = key
    blocked: set[tuple] = set()
    for scope in {s for s in scopes.values() if s is not None}:
        for access in scope.accesses:
            node = access.node
            if not isinstance(node, cst.Name):
                continue
            ref_keys = {(a.scope, a.name) for a in access.referents
                        if getattr(a, "scope", None) is not None}
            if not ref_keys & set(keys):
                continue
            if not ref_keys <= set(keys):
                blocked |= ref_keys  # the read may see another value
                continue
            kind = _read_kind(node, parents, loops, q)
            feeds = source_of.get(id(node))
            if kind is None and feeds is None:
                blocked |= ref_keys
                continue
            for k in ref_keys:
                reads.append((k, node, kind or "source", feeds))
    host = set(keys) - blocked
    while True:  # drop names that feed or are fed by a name that is not host-side
        drop = set()
        for k in host:
            for _, _, sources in binds[k]:
                for src in sources:
                    sc = scopes.get(src)
                    acc = [a for a in (sc.accesses[src.value] if sc is not None else ())
                           if a.node is src]
                    if not acc or any((r.scope, r.name) not in host for a in acc
                                      for r in a.referents if getattr(r, "scope", None)):
                        drop.add(k)
        for k, _, kind, feeds in reads:
            if k in host and kind == "source" and feeds not in host:
                drop.add(k)
        if not drop:
            break
        host -= drop
    # a root for every derived name, and a gather for the whole to matter
    grounded: set[tuple] = {k for k in host if any(kind == "root" for kind, _, _ in binds[k])}
    changed = True
    while changed:
        changed = False
        for k in host - grounded:
            if all(kind == "root" or all(_refs(src, scopes) <= grounded for src in sources)
                   for kind, _, sources in binds[k]):
                grounded.add(k)
                changed = True
    host &= grounded
    gathers = {id(node) for k, node, kind, _ in reads if k in host and kind == "gather"}
    if not gathers:
        return set(), set()
    arrays = {id(value) for k in host for kind, value, _ in binds[k] if kind == "root"}
    return arrays, gathers


def _refs(src: cst.Name, scopes) -> set[tuple]:
    sc = scopes.get(src)
    return {(r.scope, r.name) for a in (sc.accesses[src.value] if sc is not None else ())
            if a.node is src for r in a.referents if getattr(r, "scope", None) is not None}


def _binding(value: cst.BaseExpression, q) -> tuple[str, cst.BaseExpression, list[cst.Name]]:
    """How an assignment binds a possible host array: ``root`` (a ``torch.tensor`` with a
    dtype numpy has), ``derived`` (a move, a slice or a choice of other names: their Names),
    or ``other``."""
    if isinstance(value, cst.Call) and q(value.func) == "torch.tensor":
        positional = [a for a in value.args if a.keyword is None]
        kws = {a.keyword.value: a.value for a in value.args if a.keyword is not None}
        if len(positional) == 1 and not positional[0].star and set(kws) <= {"dtype", "device"} \
                and "dtype" in kws and q(kws["dtype"]) in _ARRAY_DTYPES:
            return "root", value, []
        return "other", value, []
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and isinstance(
            value.func.value, cst.Name) and value.func.attr.value in _MOVES:
        return "derived", value, [value.func.value]
    if isinstance(value, cst.Subscript) and isinstance(value.value, cst.Name) and len(
            value.slice) == 1 and isinstance(value.slice[0].slice, cst.Slice):
        return "derived", value, [value.value]
    if isinstance(value, cst.IfExp) and isinstance(value.body, cst.Name) and isinstance(
            value.orelse, cst.Name):
        return "derived", value, [value.body, value.orelse]
    return "other", value, []


def _read_kind(node: cst.Name, parents, loops: set[int], q) -> str | None:
    """``len``, ``metadata`` (``.shape``, ``.size()``), ``gather`` (the array of
    ``torch.stack([data[i:i + n] for i in ix])`` over host-side rows), or None."""
    parent = parents.get(node)
    if isinstance(parent, cst.Arg) and parent.value is node:
        c = parents.get(parent)
        if isinstance(c, cst.Call) and len(c.args) == 1 and q(c.func) == "builtins.len":
            return "len"
        return None
    if isinstance(parent, cst.Attribute) and parent.value is node:
        return "metadata" if parent.attr.value in _METADATA else None
    if isinstance(parent, cst.Subscript) and parent.value is node and len(
            parent.slice) == 1 and isinstance(parent.slice[0].slice, cst.Slice):
        comp = parents.get(parent)
        if isinstance(comp, cst.ListComp) and comp.elt is parent and id(comp.for_in) in loops:
            holder = parents.get(comp)
            c = parents.get(holder) if isinstance(holder, cst.Arg) else None
            if isinstance(c, cst.Call) and len(c.args) == 1 and q(c.func) == "torch.stack":
                return "gather"
    return None


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
