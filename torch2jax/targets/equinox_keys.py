"""Functions of the training code that the NNX pass gave the script's random streams
(``def main(*, rngs: nnx.Rngs)``: a model built in it, ``rngs=rngs``, or a draw,
``jax.random.randint(rngs.params(), ...)``), under the equinox target: they take a key.

* ``def main(*, rngs: nnx.Rngs)`` -> ``def main(*, key)``;
* a statement that draws from the streams, ``x = jax.random.randint(rngs.params(), ...)``,
  or builds with them, ``model = Net(..., rngs=rngs)``, has a key split off before it
  (``key, subkey = jax.random.split(key)``) that it uses instead: ``rngs.params()`` ->
  ``subkey``, ``rngs=rngs`` -> ``rngs=nnx.Rngs(subkey)``, which equinox_training.py turns
  into the model's ``key=subkey`` as it does for a model built at the top level;
* its callers pass the key: ``main(rngs=nnx.Rngs(subkey))`` -> ``main(key=subkey)``.

A function whose streams are used otherwise (handed on as they are, drawn from inside a
nested function, a lambda, a comprehension or a compound statement's header) is left as it
is: the equinox pass marks it.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import code

RNGS = "rngs"
_DRAW = m.Call(func=m.Attribute(value=m.Name(RNGS), attr=m.Name()), args=[])
_PASSED = m.Arg(keyword=m.Name(RNGS), value=m.Name(RNGS))
_RNGS_OF = m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("Rngs")),
                  args=[m.Arg(keyword=None)])


def _rngs_param(fn: cst.FunctionDef) -> bool:
    """``def f(*, rngs: nnx.Rngs)``: the streams its only parameter."""
    ps = fn.params
    return not ps.params and not ps.posonly_params and [
        p.name.value for p in ps.kwonly_params] == [RNGS] and ps.kwonly_params[0].default is None \
        and not isinstance(ps.star_kwarg, cst.Param)


def _uses_fit(fn: cst.FunctionDef) -> bool:
    """Every use of ``rngs`` in ``fn`` is a draw (``rngs.params()``) or ``rngs=rngs``, in a
    simple statement of the function's own (not of a nested function, lambda or
    comprehension), and ``key`` / ``subkey...`` are names the function does not bind."""
    uses = [n for n in findall(fn.body, m.Name(RNGS))]
    fitting = {id(d.func.value) for d in findall(fn.body, _DRAW)} | {
        id(a.value) for a in findall(fn.body, _PASSED)} | {
        id(a.keyword) for a in findall(fn.body, m.Arg(keyword=m.Name(RNGS)))}
    if any(id(n) not in fitting for n in uses):
        return False
    for nested in findall(fn.body, m.FunctionDef() | m.Lambda() | m.ListComp() | m.SetComp()
                          | m.GeneratorExp() | m.DictComp()):
        if findall(nested, m.Name(RNGS)):
            return False
    in_lines = {id(n) for line in findall(fn.body, m.SimpleStatementLine())
                for n in findall(line, m.Name(RNGS))}
    if any(id(n) not in in_lines for n in uses):
        return False  # (a compound statement's header)
    bound = {n.value for t in findall(fn.body, m.AssignTarget() | m.For() | m.AsName())
             for n in findall(t.target if not isinstance(t, cst.AsName) else t.name,
                              m.Name())}
    return not any(n == "key" or n.startswith("subkey") for n in bound)


class _Split(cst.CSTTransformer):
    """Each simple statement that uses the streams: a key split off before it for each use
    (``subkey``, or ``subkey1``, ``subkey2``, ... for several: each draw its own key)."""

    def visit_SimpleStatementLine(self, node) -> bool:
        self.n = len(findall(node, _DRAW)) + len(findall(node, _PASSED))
        self.at = 0
        return True

    def _next(self) -> str:
        self.at += 1
        return "subkey" if self.n == 1 else f"subkey{self.at}"

    def leave_Call(self, original_node, updated_node):
        if m.matches(original_node, _DRAW):
            return cst.Name(self._next())
        return updated_node

    def leave_Arg(self, original_node, updated_node):
        if m.matches(original_node, _PASSED):
            return updated_node.with_changes(
                value=cst.parse_expression(f"nnx.Rngs({self._next()})"))
        return updated_node

    def leave_SimpleStatementLine(self, original_node, updated_node):
        if not self.n:
            return updated_node
        split = ("key, subkey = jax.random.split(key)\n" if self.n == 1 else
                 f"key, {', '.join(f'subkey{i + 1}' for i in range(self.n))} = "
                 f"jax.random.split(key, {self.n + 1})\n")
        return cst.FlattenSentinel([
            cst.parse_statement(split).with_changes(leading_lines=updated_node.leading_lines),
            updated_node.with_changes(leading_lines=[])])


class _Callers(cst.CSTTransformer):
    """``f(rngs=nnx.Rngs(k))`` of the functions rewritten -> ``f(key=k)``."""

    def __init__(self, names: set[str]) -> None:
        self.names = names

    def leave_Call(self, original_node, updated_node):
        if not m.matches(updated_node.func, m.Name()) or updated_node.func.value not in \
                self.names:
            return updated_node
        args = []
        for a in updated_node.args:
            if a.keyword is not None and a.keyword.value == RNGS:
                seed = a.value.args[0].value
                k = f"jax.random.key({code(seed)})" if isinstance(seed, cst.Integer) \
                    else code(seed)
                a = a.with_changes(keyword=cst.Name("key"), value=cst.parse_expression(k))
            args.append(a)
        return updated_node.with_changes(args=args)


def keyed_functions(module: cst.Module, skip: set[str]) -> cst.Module:
    """The module with its functions of ``*, rngs: nnx.Rngs`` (not those named in ``skip``,
    the builders of layers) taking a key (the module's docstring)."""
    fns = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)
           and s.name.value not in skip and _rngs_param(s) and _uses_fit(s)}
    if not fns:
        return module
    # every call of them passes nnx.Rngs(k): k becomes their key
    for c in findall(module, m.Call(func=m.Name())):
        if c.func.value in fns and not all(
                m.matches(a.value, _RNGS_OF) for a in c.args
                if a.keyword is not None and a.keyword.value == RNGS):
            fns.pop(c.func.value)
    if not fns:
        return module
    body = []
    for s in module.body:
        if isinstance(s, cst.FunctionDef) and s.name.value in fns:
            params = s.params.with_changes(kwonly_params=[
                p.with_changes(name=cst.Name("key"), annotation=None)
                for p in s.params.kwonly_params])
            s = s.with_changes(params=params, body=s.body.visit(_Split()))
        body.append(s)
    return module.with_changes(body=body).visit(_Callers(set(fns)))
