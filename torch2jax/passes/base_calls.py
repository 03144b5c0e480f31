"""A torch layer's method called through its class on ``self``, written as ``super()``'s,
before the analysis (a canonical form, as ``passes/module_methods.py``).

transformers' SqueezeBERT subclasses ``nn.LayerNorm`` and calls the base explicitly::

    class SqueezeBertLayerNorm(nn.LayerNorm):
        def __init__(self, hidden_size, eps=1e-12):
            nn.LayerNorm.__init__(self, normalized_shape=hidden_size, eps=eps)

        def forward(self, x):
            x = nn.LayerNorm.forward(self, x.permute(0, 2, 1))

In a class with that one base, ``Base.method(self, ...)`` in one of its methods is
``super().method(...)``: the next class of the instance's method resolution order is the base
(a subclass mixing in another class could put one between them; torch's layers are not built
that way). The converter translates ``super().__init__(...)`` / ``super().forward(...)`` of a
subclassed layer; the explicit form was left as torch's and failed when the model was built.
Only bases from torch (``nn.X`` with ``nn`` imported from torch) are rewritten.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m


def _torch_names(module: cst.Module) -> set[str]:
    """The top-level names the file binds to torch's packages (``torch``, ``nn``)."""
    names: set[str] = set()
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    dotted = cst.Module([]).code_for_node(alias.name)
                    if dotted.split(".")[0] == "torch":
                        names.add(alias.asname.name.value if alias.asname and isinstance(
                            alias.asname.name, cst.Name) else dotted.split(".")[0])
            elif isinstance(small, cst.ImportFrom) and small.module is not None and (
                    cst.Module([]).code_for_node(small.module).split(".")[0] == "torch") and (
                    not isinstance(small.names, cst.ImportStar)):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    if isinstance(bound, cst.Name):
                        names.add(bound.value)
    return names


class _ViaSuper(cst.CSTTransformer):
    def __init__(self, torch_names: set[str]) -> None:
        self.torch_names = torch_names
        # the scopes: ("class", its one torch base's code or None), ("def", the method's
        # instance or None: a method directly in such a class, as super() needs its cell)
        self.scopes: list[tuple[str, str | None]] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        base = None
        if len(node.bases) == 1 and not node.keywords and not node.bases[0].keyword:
            value = node.bases[0].value
            root = value
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(value, cst.Attribute) and isinstance(root, cst.Name) and (
                    root.value in self.torch_names):
                base = cst.Module([]).code_for_node(value)
        self.scopes.append(("class", base))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        method = bool(self.scopes) and self.scopes[-1][0] == "class" and (
            self.scopes[-1][1] is not None) and not node.decorators and node.params.params
        self.scopes.append(("def", node.params.params[0].name.value if method else None))

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.scopes.append(("def", None))

    def _leave(self, original_node, updated_node):
        self.scopes.pop()
        return updated_node

    leave_ClassDef = leave_FunctionDef = leave_Lambda = _leave

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self.scopes or self.scopes[-1][1] is None or self.scopes[-1][0] != "def":
            return updated_node
        instance = self.scopes[-1][1]
        base = self.scopes[-2][1]
        func, args = updated_node.func, updated_node.args
        if not (isinstance(func, cst.Attribute) and args and args[0].keyword is None
                and not args[0].star and m.matches(args[0].value, m.Name(instance))
                and cst.Module([]).code_for_node(func.value) == base):
            return updated_node
        return updated_node.with_changes(
            func=func.with_changes(value=cst.Call(cst.Name("super"))), args=args[1:])


def canonicalise(module: cst.Module) -> cst.Module:
    """The file with ``Base.method(self, ...)`` in a class whose one base is torch's ``Base``
    written as ``super().method(...)``."""
    names = _torch_names(module)
    if not names:
        return module
    return module.visit(_ViaSuper(names))
