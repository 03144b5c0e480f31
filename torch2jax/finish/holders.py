"""Invariant (e), through names: a name that holds a torch object read elsewhere.

``ACTS = {"gelu": nn.GELU}`` then ``self.act = ACTS[name]()``, ``f = ACTS["fn"]; y = f(x)``, or
``def __init__(self, act=nn.Hardshrink): self.act = act()``: the torch object is reached on a
line that reads no torch name. A name assigned (or a parameter defaulted) from an expression
made of a torch read, or of another such name, holds torch code; each read of it is marked too
(finish/invariants.py), so that the line that fails at run time is a marked one.
"""

from __future__ import annotations

import ast

from torch2jax.finish import removed as rmv


def _scope(node: ast.AST, name: str, parents: dict[int, ast.AST]) -> int:
    """The id of the function that binds ``name`` as seen from ``node`` (0: the module)."""
    at = parents.get(id(node))
    while at is not None:
        if isinstance(at, rmv._FUNCTIONS) and rmv._local_to(at, name):
            return id(at)
        at = parents.get(id(at))
    return 0


def _made_of(value: ast.AST | None, is_torch) -> bool:
    """``value`` is a torch object, or a container of them: ``nn.GELU``, ``nn.GELU()``,
    ``ACTS[name]`` (ACTS one), ``{"a": nn.ReLU}``, ``nn.ReLU if c else nn.GELU``."""
    if isinstance(value, (ast.Dict,)):
        return any(_made_of(v, is_torch) for v in value.values)
    if isinstance(value, (ast.List, ast.Tuple, ast.Set)):
        return any(_made_of(v, is_torch) for v in value.elts)
    if isinstance(value, ast.IfExp):
        return _made_of(value.body, is_torch) or _made_of(value.orelse, is_torch)
    while isinstance(value, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
                value.func.attr[:1].islower():
            # F.dropout(attn, ...), torch.cat(...): a value computed by torch, on its own
            # (marked) line; it is an array, not a torch object read later
            return False
        value = value.func if isinstance(value, ast.Call) else value.value
    return isinstance(value, ast.Name) and is_torch(value)


def torch_holders(tree: ast.Module, reads: list[ast.Name], parents: dict[int, ast.AST]
                  ) -> list[tuple[ast.Name, str]]:
    """The reads of names that hold torch code (see the module docstring), each with its
    message; ``reads`` are the reads of torch names themselves."""
    direct = {id(n) for n in reads}
    held: set[tuple[int, str]] = set()  # (scope id, name)

    def is_torch(n: ast.Name) -> bool:
        return id(n) in direct or (_scope(n, n.id, parents), n.id) in held

    binds: list[tuple[int, str, ast.AST]] = []  # (scope id, name, value)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            binds += [(_scope(t, t.id, parents), t.id, node.value) for t in targets
                      if isinstance(t, ast.Name)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            pairs = [*zip(positional[len(positional) - len(a.defaults):], a.defaults),
                     *((k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)]
            binds += [(id(node), arg.arg, d) for arg, d in pairs]
    changed = True
    while changed:
        changed = False
        for key in ((s, n) for s, n, v in binds if (s, n) not in held and _made_of(v, is_torch)):
            held.add(key)
            changed = True
    if not held:
        return []
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in direct \
                and (_scope(n, n.id, parents), n.id) in held:
            why = f"`{n.id}` holds torch code (its assignment is marked): using it runs torch"
            out.append((n, why))
    return sorted(out, key=lambda c: (c[0].lineno, c[0].col_offset))
