"""A Dataset's methods on the host, in numpy.

grain (and torch's DataLoader before it) reads a map-style dataset one element at a time on the
host. Translated to ``jnp`` like model code, ``__getitem__`` dispatches every small op to the
device and copies the result back, and an in-place write becomes a functional ``.at[].set``
copy: a minGPT-shaped dataset then costs milliseconds per element. A hand-written JAX input
pipeline computes its elements in numpy and moves one collated batch to the device.

numpy is also closer to torch here than ``jnp`` is: basic slicing makes views and an indexed
assignment writes through them, as in torch (``y = cat[1:]; y[:2] = -1`` changes ``cat``), and
``.clone()`` is ``.copy()``. So each method of a ``Dataset`` class is translated from the torch
source with the small table below. A method that reads any other torch API (a random draw
without a generator, ``F.*``, a method of torch's tensors outside the table) is left to the
rewriter's ``jnp`` translation, which is correct, only slower: the table either translates the
whole method or none of it.

dtypes: torch's default float is float32 and numpy's float64, so a float tensor made without a
dtype gets ``dtype=np.float32``; a creation whose dtype the table cannot tell
(``torch.tensor(values)`` with no dtype) keeps the method on the ``jnp`` route. Integers are
int64 on both sides. Arithmetic on int64 arrays that torch promotes to float32 (``x / 2``)
promotes to float64 in numpy; the batch is float32 again on the device (JAX's default), so the
difference is the rounding of one division.

The random draws of a dataset with its own generator (``g = torch.Generator();
g.manual_seed(s)``, ``torch.randperm(n, generator=g)``) become a numpy ``Generator`` seeded
with the same number: a different stream from torch's, as every translated draw is. A draw
from torch's global generator (``torch.randint(n, size=(L,))``, ``torch.rand(1)``,
``torch.randn(L)`` in ``__getitem__``, issue 28) comes from numpy's global generator
(``np.random.randint``, ``np.random.random``, ...) when the caller allows it: the dataset is
read on the host, one item at a time, where a JAX key per item would cost a device round trip.
numpy's global generator is, like torch's, one stream for the whole process: the translation
of every ``torch.manual_seed(s)`` of the program, in whichever file and helper it stands,
seeds it with ``s`` too (issue 29, docs/training.md "Where the random state lives on the
host").
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.torch_api import TORCH_ONLY_TENSOR_METHODS
from torch2jax.passes.common import arg
from torch2jax.passes.numpy_draws import numpy_draw

DTYPES = {
    "torch.long": "np.int64", "torch.int64": "np.int64", "torch.int": "np.int32",
    "torch.int32": "np.int32", "torch.int16": "np.int16", "torch.short": "np.int16",
    "torch.int8": "np.int8", "torch.uint8": "np.uint8", "torch.bool": "np.bool_",
    "torch.float": "np.float32", "torch.float32": "np.float32", "torch.double": "np.float64",
    "torch.float64": "np.float64", "torch.half": "np.float16", "torch.float16": "np.float16",
}
_CAST_METHODS = {"long": "np.int64", "int": "np.int32", "float": "np.float32",
                 "double": "np.float64", "half": "np.float16", "bool": "np.bool_"}
# methods that are the receiver itself on the host
_IDENTITY_METHODS = {"contiguous", "numpy", "cpu", "detach"}
# methods numpy arrays have with torch's meaning (no dim= keyword: see _method)
_SAME_METHODS = {"item", "tolist", "reshape", "copy", "sum", "mean", "max", "min", "argmax",
                 "argmin", "prod", "all", "any", "astype", "tobytes"}


class _Refused(Exception):
    pass


def _dotted(node: cst.BaseExpression) -> bool:
    """``a.b.c``: names only (``torch.arange(4).reshape`` is a method of a call's value)."""
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _np(name: str, *args: cst.Arg) -> cst.Call:
    return cst.Call(func=cst.parse_expression(name), args=list(args))


def _paren(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.Integer,
                         cst.Float, cst.SimpleString, cst.Tuple, cst.List)):
        return node
    return node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])


class _ToNumpy(cst.CSTTransformer):
    """Translates one method; raises :class:`_Refused` at the first construct off the table.
    ``q`` gives the qualified name of a node of the original tree."""

    def __init__(self, q: Callable[[cst.CSTNode], str | None],
                 global_draws: bool = False) -> None:
        super().__init__()
        self.q = q
        # draws from torch's global generator become numpy's global ones (False: refused)
        self.global_draws = global_draws
        self.used_global = False
        self.funcs: set[int] = set()  # original call functions (checked at the call)
        self.generators: set[str] = set()  # local names bound to torch.Generator()

    def visit_Call(self, node: cst.Call) -> None:
        self.funcs.add(id(node.func))

    def visit_Assign(self, node: cst.Assign) -> None:
        if (len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)
                and isinstance(node.value, cst.Call)):
            q = self.q(node.value.func)
            inner = node.value.func
            if q == "torch.Generator" or (isinstance(inner, cst.Attribute)
                                          and inner.attr.value == "manual_seed"
                                          and isinstance(inner.value, cst.Call)
                                          and self.q(inner.value.func) == "torch.Generator"):
                self.generators.add(node.targets[0].target.value)

    def _torch_name(self, original: cst.CSTNode) -> str | None:
        q = self.q(original)
        if q is not None and q.split(".")[0] in ("torch", "torchvision"):
            return q
        return None

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._reference(original_node, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute
                        ) -> cst.BaseExpression:
        return self._reference(original_node, updated_node)

    def _reference(self, original, updated):
        q = self._torch_name(original) if _dotted(original) else None
        if q is None or id(original) in self.funcs:
            return updated
        if q in DTYPES:
            return cst.parse_expression(DTYPES[q])
        if isinstance(original, cst.Name) and q == "torch":
            return updated  # the head of torch.x: judged as the attribute
        raise _Refused(q)

    def leave_Expr(self, original_node: cst.Expr, updated_node: cst.Expr):
        # g.manual_seed(s) on a generator made here: the numpy generator is made seeded
        call = original_node.value
        if (m.matches(call, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("manual_seed"))))
                and call.func.value.value in self.generators and len(call.args) == 1):
            return cst.Assign(targets=[cst.AssignTarget(cst.Name(call.func.value.value))],
                              value=_np("np.random.default_rng", arg(call.args[0].value)))
        return updated_node

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        q = self._torch_name(original_node.func) if _dotted(original_node.func) else None
        if q is not None:
            return self._function(q, original_node, updated_node)
        if isinstance(updated_node.func, cst.Attribute):
            return self._method(updated_node)
        return updated_node

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript
                        ) -> cst.BaseExpression:
        """``torch.sort(x)[0]``: only the sorted values (``np.sort``), not the pair of
        numpy calls the sort becomes with the index taken from it (both are pure)."""
        value, index = updated_node.value, updated_node.slice
        if isinstance(value, cst.Tuple) and len(index) == 1 and m.matches(
                index[0].slice, m.Index(value=m.Integer())) and isinstance(
                original_node.value, cst.Call) and _dotted(original_node.value.func) and (
                self.q(original_node.value.func) == "torch.sort"):
            at = int(index[0].slice.value.value)
            if at < len(value.elements):
                return value.elements[at].value
        return updated_node

    # torch.* functions
    def _function(self, q: str, original: cst.Call, node: cst.Call) -> cst.BaseExpression:
        pos = [a.value for a in node.args if a.keyword is None and not a.star]
        kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if any(a.star for a in node.args):
            raise _Refused(q)
        kw.pop("device", None)
        if "requires_grad" in kw and not m.matches(kw.pop("requires_grad"), m.Name("False")):
            raise _Refused(q)
        if q.count(".") != 1:
            raise _Refused(q)  # torch.nn.functional.*, torchvision.*, torch.utils.*, ...
        name = q.rsplit(".", 1)[-1]
        dtype = kw.pop("dtype", None)
        if q == "torch.Generator" and not pos and not kw:
            return _np("np.random.default_rng")
        if name in ("tensor", "as_tensor") and len(pos) == 1 and not kw:
            if dtype is None:
                raise _Refused(q)  # float32 or int64 depends on the values
            return _np("np.array" if name == "tensor" else "np.asarray", arg(pos[0]),
                       arg(dtype, "dtype"))
        if name == "from_numpy" and len(pos) == 1 and not kw and dtype is None:
            return _np("np.asarray", arg(pos[0]))
        if name in ("zeros", "ones", "empty") and pos and not kw:
            shape = pos[0] if len(pos) == 1 else cst.Tuple([cst.Element(p) for p in pos])
            return _np(f"np.{name}", arg(shape),
                       arg(dtype or cst.parse_expression("np.float32"), "dtype"))
        if name == "full" and len(pos) == 2 and not kw:
            if dtype is None:
                if isinstance(pos[1], cst.Float):
                    dtype = cst.parse_expression("np.float32")
                elif isinstance(pos[1], cst.Integer):
                    dtype = cst.parse_expression("np.int64")
                else:
                    raise _Refused(q)
            return _np("np.full", arg(pos[0]), arg(pos[1]), arg(dtype, "dtype"))
        if name == "arange" and pos and not kw:
            if dtype is None and any(isinstance(p, cst.Float) for p in pos):
                dtype = cst.parse_expression("np.float32")
            args = [arg(p) for p in pos]
            return _np("np.arange", *args, *([arg(dtype, "dtype")] if dtype is not None else []))
        if name in ("randint", "rand", "randn", "randperm") and self._drawn(kw):
            return self._draw(name, pos, kw, dtype, q)
        if dtype is not None:
            raise _Refused(q)
        if name in ("cat", "concat", "concatenate", "stack") and len(pos) == 1 and set(kw) <= {
                "dim"}:
            fn = "np.stack" if name == "stack" else "np.concatenate"
            return _np(fn, arg(pos[0]), arg(kw.get("dim", cst.Integer("0")), "axis"))
        if name == "flip" and len(pos) + len(kw) == 2 and set(kw) <= {"dims"}:
            dims = pos[1] if len(pos) == 2 else kw["dims"]
            return _np("np.flip", arg(pos[0]), arg(dims, "axis"))
        if name == "sort" and len(pos) in (1, 2) and set(kw) <= {"dim"}:
            x = pos[0]
            dim = pos[1] if len(pos) == 2 else kw.get("dim", cst.parse_expression("-1"))
            return cst.Tuple([
                cst.Element(_np("np.sort", arg(x), arg(dim, "axis"))),
                cst.Element(_np("np.argsort", arg(x), arg(dim, "axis"),
                                arg(cst.SimpleString('"stable"'), "kind")))])
        if name == "where" and len(pos) == 3 and not kw:
            return _np("np.where", *(arg(p) for p in pos))
        raise _Refused(q)  # (a draw without a generator the table knows: refused above)

    def _drawn(self, kw: dict) -> bool:
        generator = kw.get("generator")
        return (isinstance(generator, cst.Name) and generator.value in self.generators
                or generator is None and self.global_draws)

    def _draw(self, name: str, pos: list, kw: dict, dtype, q: str) -> cst.BaseExpression:
        """A draw from the dataset's own generator, or from torch's global one (numpy's
        global generator: a global draw in ``__getitem__`` is a host draw of the input
        pipeline, as grain reads the dataset on the host)."""
        generator = kw.pop("generator", None)
        size = kw.pop("size", None)
        if kw:
            raise _Refused(q)
        if generator is None:
            self.used_global = True
        draw = _draw_parts(name, pos, size, dtype)
        if draw is None:
            raise _Refused(q)
        kind, parts = draw
        return numpy_draw(kind, generator, **parts)

    # tensor methods (the receiver's kind is not known here: only torch's own names change)
    def _method(self, node: cst.Call) -> cst.BaseExpression:
        meth = node.func.attr.value
        recv = node.func.value
        pos = [a.value for a in node.args if a.keyword is None and not a.star]
        if any(a.star for a in node.args):
            if meth in _SAME_METHODS or meth in ("view", "permute", "flip"):
                raise _Refused(meth)
            return node
        kws = {a.keyword.value for a in node.args if a.keyword is not None}
        if meth == "manual_seed" and m.matches(recv, m.Call(
                func=m.Attribute(value=m.Name("np"), attr=m.Name("random")) | m.Attribute(
                    attr=m.Name("default_rng")))) and len(pos) == 1 and not recv.args:
            return recv.with_changes(args=[arg(pos[0])])
        if kws & {"dim", "keepdim"}:
            if meth in _SAME_METHODS or meth in TORCH_ONLY_TENSOR_METHODS:
                raise _Refused(meth)  # torch's dim= (and max(dim)'s (values, indices))
            return node
        if meth == "clone" and not node.args:
            return node.with_changes(func=node.func.with_changes(attr=cst.Name("copy")))
        if meth in _IDENTITY_METHODS and not node.args:
            return recv
        if meth in _CAST_METHODS and not node.args:
            return cst.Call(func=cst.Attribute(recv, cst.Name("astype")),
                            args=[arg(cst.parse_expression(_CAST_METHODS[meth]))])
        if meth == "view" and pos and not kws:
            if any(self._is_dtype(p) for p in pos):
                raise _Refused(meth)
            return node.with_changes(func=node.func.with_changes(attr=cst.Name("reshape")))
        if meth == "unsqueeze" and len(pos) == 1 and not kws:
            return _np("np.expand_dims", arg(recv), arg(pos[0]))
        if meth == "flip" and pos and not kws:
            dims = pos[0] if len(pos) == 1 else cst.Tuple([cst.Element(p) for p in pos])
            return _np("np.flip", arg(recv), arg(dims, "axis"))
        if meth == "permute" and pos and not kws:
            dims = pos[0] if len(pos) == 1 else cst.Tuple([cst.Element(p) for p in pos])
            return cst.Call(func=cst.Attribute(recv, cst.Name("transpose")), args=[arg(dims)])
        if meth == "unique" and not node.args:  # sorted, as torch's default
            return _np("np.unique", arg(recv))
        if meth in ("numel", "nelement") and not node.args:
            return cst.Attribute(_paren(recv), cst.Name("size"))
        if meth == "dim" and not node.args:
            return cst.Attribute(_paren(recv), cst.Name("ndim"))
        if meth == "t" and not node.args:
            return cst.Attribute(_paren(recv), cst.Name("T"))
        if meth == "size" and len(pos) <= 1 and not kws:
            shape = cst.Attribute(_paren(recv), cst.Name("shape"))
            return shape if not pos else cst.Subscript(shape, [cst.SubscriptElement(
                cst.Index(pos[0]))])
        if meth in _SAME_METHODS:
            return node
        if meth in TORCH_ONLY_TENSOR_METHODS:
            raise _Refused(meth)
        return node

    def _is_dtype(self, node: cst.BaseExpression) -> bool:
        return m.matches(node, m.Attribute(value=m.Name("np")))


def _draw_parts(name: str, pos: list, size, dtype) -> tuple[str, dict] | None:
    """The parts of a draw (:func:`numpy_draw`'s keywords) from torch's positional arguments
    and its ``size=`` / ``dtype=``, or None for a form off the table."""
    if name == "randperm" and len(pos) == 1 and size is None and dtype is None:
        return name, {"n": pos[0]}
    if name == "randint" and (len(pos) in (2, 3) and size is None
                              or len(pos) in (1, 2) and size is not None):
        if size is not None:
            pos = [*pos, size]
        low, high, size = ([cst.Integer("0")] + pos) if len(pos) == 2 else pos
        return name, {"low": low, "high": high, "size": size, "dtype": dtype}
    if name in ("rand", "randn") and (pos and size is None or size is not None and not pos):
        if size is None:
            size = pos[0] if len(pos) == 1 else cst.Tuple([cst.Element(p) for p in pos])
        return name, {"size": size, "dtype": dtype}
    return None


def numpy_method(fn: cst.FunctionDef, q: Callable[[cst.CSTNode], str | None],
                 global_draws: bool = False) -> tuple[cst.FunctionDef, bool] | None:
    """``fn`` (a method of the original torch tree) translated to numpy, and whether it draws
    from numpy's global generator (torch's global generator's draws, when ``global_draws``);
    None when it reads torch API outside the table (the method then keeps the rewriter's
    ``jnp`` form)."""
    numpy = _ToNumpy(q, global_draws)
    try:
        out = fn.visit(numpy)
    except _Refused:
        return None
    return (out, numpy.used_global) if isinstance(out, cst.FunctionDef) else None


def reads_torch(fn: cst.FunctionDef, q: Callable[[cst.CSTNode], str | None]) -> bool:
    """Whether ``fn`` names torch, or calls a method only torch's tensors have (a method with
    neither is left to the rewriter)."""
    return any((q(n) or "").split(".")[0] in ("torch", "torchvision")
               for n in m.findall(fn, m.Name() | m.Attribute())) or any(
        c.func.attr.value in TORCH_ONLY_TENSOR_METHODS
        for c in m.findall(fn, m.Call(func=m.Attribute())))
