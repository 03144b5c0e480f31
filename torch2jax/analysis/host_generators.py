"""Seeded ``torch.Generator`` objects that become numpy Generators on the host.

``gen = torch.Generator().manual_seed(s)``, passed around as an object (to a method of the
class that builds it, or to a function) and read by draws (``torch.randint(...,
generator=gen)``, ``torch.multinomial(..., generator=gen)``): torch's generator is a mutable
object whose state advances at each draw, wherever it is drawn from. ``numpy.random.Generator``
has the same meaning (``np.random.default_rng(s)``, each draw advancing it), where a JAX key
would have to be split and handed back at every draw. Such draws build data (a corpus, a
table of successors), so they belong on the host anyway.

A generator variable becomes a numpy Generator when every read of it is

* the ``generator=`` of a draw that has a numpy form (``NUMPY_DRAWS``), outside the classes of
  modules (their methods are traced) and outside any function that calls ``backward()`` (the
  loss and the step around it are traced), or
* an argument of a call of a function of the file (``f(..., gen)``, ``self.m(..., gen)`` in
  the class that defines ``m``) whose parameter is itself such a generator: every call of
  that function passes one there, and every read of the parameter is one of these two.

(a fixpoint over the generator variables and the parameters that receive them). A generator
read in any other way (a loader's or a split's ``generator=``, ``get_state()``, a draw in a
forward) keeps its other translations (``passes/data.py``) or its mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment, ScopeProvider

from torch2jax.analysis.metadata import ParentNodeProvider

GENERATORS = frozenset({"torch.Generator", "torch._C.Generator"})
NUMPY_DRAWS = frozenset({"torch.randint", "torch.randperm", "torch.rand", "torch.randn",
                         "torch.multinomial"})


@dataclass
class NumpyGenerators:
    """``assigns``: ids of the ``g = torch.Generator().manual_seed(s)`` statements, to the seed
    (source); ``ctors``: ids of their ``torch.Generator()`` calls; ``draws``: ids of the draw
    calls from one, to the generator's name there."""

    assigns: dict[int, str] = field(default_factory=dict)
    ctors: set[int] = field(default_factory=set)
    draws: dict[int, str] = field(default_factory=dict)


def _generator_assign(node: cst.Assign, q) -> tuple[cst.Call, str] | None:
    """``g = torch.Generator().manual_seed(s)``: the ``torch.Generator()`` call and the seed
    (source). (An unseeded generator, or one seeded by a later statement, is not one.)"""
    if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
        return None
    value = node.value
    if not m.matches(value, m.Call(func=m.Attribute(attr=m.Name("manual_seed")))):
        return None
    if len(value.args) != 1 or value.args[0].keyword is not None or value.args[0].star:
        return None
    seed = cst.Module([]).code_for_node(value.args[0].value)
    value = value.func.value
    if not isinstance(value, cst.Call) or value.args or q(value.func) not in GENERATORS:
        return None
    return value, seed


def find_numpy_generators(wrapper: cst.MetadataWrapper, module_classes: set[str]
                          ) -> NumpyGenerators:
    scopes = wrapper.resolve(ScopeProvider)
    parents = wrapper.resolve(ParentNodeProvider)
    out = NumpyGenerators()

    def q(node: cst.CSTNode) -> str | None:
        scope = scopes.get(node)
        names = scope.get_qualified_names_for(node) if scope is not None else None
        return min(n.name for n in names) if names else None

    def enclosing(node: cst.CSTNode, kind: type) -> list[cst.CSTNode]:
        found = []
        while node is not None:
            node = parents.get(node)
            if isinstance(node, kind):
                found.append(node)
        return found

    functions: dict[str, list[cst.FunctionDef]] = {}  # name -> definitions (any scope)
    assigns: dict[cst.Assign, tuple[cst.Call, str]] = {}
    backward_functions: set[int] = set()

    class _Walk(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            functions.setdefault(node.name.value, []).append(node)

        def visit_Assign(self, node: cst.Assign) -> None:
            found = _generator_assign(node, q)
            if found is not None:
                assigns[node] = found

        def visit_Call(self, node: cst.Call) -> None:
            if m.matches(node.func, m.Attribute(attr=m.Name("backward"))):
                backward_functions.update(id(f) for f in enclosing(node, cst.FunctionDef))

    wrapper.module.visit(_Walk())
    if not assigns:
        return out

    def traced(node: cst.CSTNode) -> bool:
        """Inside a module class's body or a function that calls backward()."""
        if any(c.name.value in module_classes for c in enclosing(node, cst.ClassDef)):
            return True
        return any(id(f) in backward_functions for f in enclosing(node, cst.FunctionDef))

    def callee(call: cst.Call) -> cst.FunctionDef | None:
        """The function of the file a call calls: ``f(...)`` or ``self.m(...)`` (``m`` defined
        in the class whose method makes the call); None for any other callee."""
        func = call.func
        if isinstance(func, cst.Name):
            defs = [d for d in functions.get(func.value, ())
                    if not enclosing(d, cst.ClassDef)]
            return defs[0] if len(defs) == 1 else None
        if m.matches(func, m.Attribute(value=m.Name("self"), attr=m.Name())):
            classes = enclosing(call, cst.ClassDef)
            if not classes:
                return None
            defs = [d for d in functions.get(func.attr.value, ())
                    if enclosing(d, cst.ClassDef)[:1] == classes[:1]]
            return defs[0] if len(defs) == 1 else None
        return None

    def param_of(fn: cst.FunctionDef, call: cst.Call, arg: cst.Arg) -> cst.Param | None:
        if arg.star:
            return None
        params = list(fn.params.params)
        if arg.keyword is not None:
            hit = [p for p in (*params, *fn.params.kwonly_params)
                   if p.name.value == arg.keyword.value]
            return hit[0] if hit else None
        positional = [a for a in call.args if a.keyword is None]
        offset = 1 if isinstance(call.func, cst.Attribute) else 0  # self
        i = positional.index(arg) + offset
        return params[i] if i < len(params) else None

    def assignment_of(name: cst.Name) -> set[cst.CSTNode]:
        scope = scopes.get(name)
        if scope is None:
            return set()
        return {r.node for acc in scope.accesses[name.value] if acc.node is name
                for r in acc.referents if isinstance(r, Assignment)}

    # the candidates: generator assignments (the Assign's target Name) and parameters
    alive: set[cst.CSTNode] = set()
    reads: dict[cst.CSTNode, list[cst.Name]] = {}
    for assign in assigns:
        target = assign.targets[0].target
        scope = scopes.get(target)
        if scope is None:
            continue
        hits = [a for a in scope.assignments[target.value] if isinstance(a, Assignment)
                and a.node is target]
        if len(scope.assignments[target.value]) != 1 or not hits:
            continue  # rebound: its value is not one generator
        alive.add(target)
        reads[target] = [acc.node for acc in hits[0].references if isinstance(acc.node, cst.Name)]
    params: dict[cst.Param, cst.FunctionDef] = {}
    for defs in functions.values():
        for fn in defs:
            for p in (*fn.params.params, *fn.params.kwonly_params):
                scope = scopes.get(p.name)
                if scope is None or p.default is not None:
                    continue
                hits = [a for a in scope.assignments[p.name.value] if isinstance(a, Assignment)
                        and a.node is p]
                if len(scope.assignments[p.name.value]) != 1 or not hits:
                    continue
                params[p] = fn
                alive.add(p)
                reads[p] = [acc.node for acc in hits[0].references
                            if isinstance(acc.node, cst.Name)]
    calls_of: dict[int, list[cst.Call]] = {}
    refs_of: dict[int, int] = {}

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            fn = callee(node)
            if fn is not None:
                calls_of.setdefault(id(fn), []).append(node)

        def visit_Name(self, node: cst.Name) -> None:
            for fn in functions.get(node.value, ()):
                refs_of[id(fn)] = refs_of.get(id(fn), 0) + 1

    wrapper.module.visit(_Calls())

    def read_ok(name: cst.Name) -> tuple[bool, cst.Call | None]:
        parent = parents.get(name)
        if not isinstance(parent, cst.Arg):
            return False, None
        call = parents.get(parent)
        if not isinstance(call, cst.Call):
            return False, None
        if parent.keyword is not None and parent.keyword.value == "generator" and (
                q(call.func) in NUMPY_DRAWS) and not traced(call):
            return True, call
        fn = callee(call)
        p = param_of(fn, call, parent) if fn is not None else None
        return p is not None and p in alive, None

    changed = True
    while changed:
        changed = False
        for node in list(alive):
            ok = all(read_ok(r)[0] for r in reads[node])
            if ok and isinstance(node, cst.Param):
                fn = params[node]
                sites = calls_of.get(id(fn), [])
                # read only by its calls (the names in its definitions aside)
                defs = len(functions[fn.name.value])
                ok = bool(sites) and refs_of.get(id(fn), 0) == len(sites) + defs and all(
                    _passes_alive(call, fn, node, param_of, assignment_of, alive)
                    for call in sites)
            if not ok:
                alive.discard(node)
                changed = True
    live_assigns = [a for a in assigns if a.targets[0].target in alive]
    if not live_assigns:
        return out
    for assign in live_assigns:
        ctor, seed = assigns[assign]
        out.assigns[id(assign)] = seed
        out.ctors.add(id(ctor))
    for node in alive:
        for r in reads[node]:
            ok, draw = read_ok(r)
            if draw is not None:
                out.draws[id(draw)] = r.value
    return out


def _passes_alive(call, fn, param, param_of, assignment_of, alive) -> bool:
    """Whether ``call`` (of ``fn``) passes a live generator (a name bound only to one) at
    ``param``."""
    for a in call.args:
        if param_of(fn, call, a) is param:
            if not isinstance(a.value, cst.Name):
                return False
            bound = assignment_of(a.value)
            return bool(bound) and bound <= alive
    return False
