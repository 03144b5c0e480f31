"""The equinox target's per-example forward code: one ``__call__`` at a time.

:class:`Forward` translates expressions and statements of a batched NNX ``__call__`` into
per-example code (explicit axes move down by one, the batch size leaves reshapes); its calls of
layers are in equinox_calls.py. What cannot be shown to keep its meaning per example raises
:class:`~torch2jax.targets.equinox_layers.EquinoxError` (a TODO on the statement).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import code, expr, int_value, try_literal
from torch2jax.targets.equinox_calls import LayerCalls
from torch2jax.targets.equinox_init import ClassInfo, _rename_stmt
from torch2jax.targets.equinox_layers import (
    AXIS_REDUCTIONS,
    ELEMENTWISE_JNP,
    JNP_POSITIONAL_AXES,
    RANK_REDUCTIONS,
    TRAILING_AXES_HELPERS,
    EquinoxError,
    Info,
    Layer,
    _fix_commas,
    _todo,
)
from torch2jax.targets.equinox_unroll import unrolled_loop

# NNX's per-module random stream (``self.rngs = rngs.fork()``), drawn from in forward code
DRAW_KEY = m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name("rngs")), args=[])


# ---------------------------------------------------------------------------- forward
class Forward(LayerCalls):
    """Per-example translation of one ``__call__``."""

    def __init__(self, owner: ClassInfo, classes: dict[str, ClassInfo],
                 analyse: Callable[[str, list[Info]], Info | None]) -> None:
        self.owner = owner
        self.classes = classes
        self.analyse = analyse
        self.env: dict[str, Info] = {}
        self.hoisted: list[cst.BaseStatement] = []
        self.key_sites: list[str] = []  # placeholders in order
        self.loop_depth = 0
        self.fresh = 0
        self.returns: list[Info] = []
        self.reduced: dict[int, str] = {}  # returned batch losses: output index -> mean | sum
        self.callees: list[tuple[str, list[Info]]] = []
        self.loop_layers: dict[str, Layer] = {}  # loop names over lists of layers
        self.loops: set[int] = set()  # ids of the loops of loop_over
        self.failed: list[str] = []  # why statements were marked
        self.calling: set[str] = set()  # the methods being written (call_method)

    def call_lambda(self, attr: str, lam: cst.Lambda, infos: list[Info]) -> Info:
        """``self.pool = lambda x: jnp.mean(x, axis=(2, 3), keepdims=True)``: its body is
        translated for the values it is called with (one translation for all calls)."""
        params = lam.params.params
        if len(params) != len(infos) or lam.params.star_arg not in (
                cst.MaybeSentinel.DEFAULT, None) or lam.params.kwonly_params:
            raise EquinoxError(f"self.{attr}: a lambda called with other arguments")
        sub = Forward(self.owner, self.classes, self.analyse)
        for p, i in zip(params, infos, strict=True):
            sub.env[p.name.value] = replace(i)
        body, out = sub.ev(lam.body)
        if sub.hoisted or sub.key_sites:
            raise EquinoxError(f"self.{attr}: a lambda that calls layers")
        new = lam.with_changes(body=body)
        prev = self.owner.lambdas.get(attr)
        if prev is not None and code(prev) != code(new):
            raise EquinoxError(f"self.{attr}: a lambda called with values of other ranks")
        self.owner.lambdas[attr] = new
        return out

    def _fix_input_rank(self, node: cst.BaseExpression, rank: int, kind: str = "") -> None:
        """A model input whose rank a layer decided: later uses agree with it."""
        for n in findall(node, m.Name()) if not isinstance(node, cst.Name) else [node]:
            info = self.env.get(n.value)
            if info is not None and info.is_input and info.rank is None:
                self.env[n.value] = replace(info, rank=rank)
                if kind:
                    self.owner.assumed.append((n.value, rank, kind))

    # --- expressions
    def ev(self, node: cst.BaseExpression) -> tuple[cst.BaseExpression, Info]:
        if isinstance(node, cst.Name):
            info = self.env.get(node.value, Info())
            if info.kind == "layers_first":
                raise EquinoxError(f"torch's LSTM state {node.value} is (num_layers, N, H), the "
                                   f"batch on axis 1: only its layers ({node.value}[-1]) are "
                                   "translated")
            return node, info
        translated = self.lstm(node) if isinstance(node, (cst.Tuple, cst.Call)) else \
            (self.lstm_cell(node) or self.gru_cell(node)) if isinstance(node, cst.Subscript) \
            else None
        if translated is not None:
            return translated
        if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString, cst.FormattedString)):
            return node, Info(rank=0)
        if isinstance(node, cst.Attribute):
            if node.attr.value == "dtype":  # (one example's is the batch's)
                inner, _ = self.ev(node.value)
                return node.with_changes(value=inner), Info(kind="dtype")
            if node.attr.value == "shape":
                inner, info = self.ev(node.value)
                return node.with_changes(value=inner), Info(kind="shape", batched=info.batched,
                                                            rank=info.rank)
            weight = self.weight_read(node)
            if weight is not None:
                return weight, Info()
            if node.attr.value == "T":
                inner, info = self.ev(node.value)
                if info.batched:
                    raise EquinoxError(".T of a batched value")
                return node.with_changes(value=inner), info
            new, lay = self.resolve(node)
            if lay is not None and lay.kind == "buffer":
                return new, Info(rank=lay.rank, lead_one=lay.lead_one)
            if m.matches(node.value, m.Name("self")):
                return new, Info()
            inner, info = self.ev(node.value)
            if info.batched:
                raise EquinoxError(f"the attribute .{node.attr.value} of a batched value")
            return node.with_changes(value=inner), Info()
        if isinstance(node, cst.Subscript):
            return self.subscript(node)
        if isinstance(node, cst.BinaryOperation):
            left, li = self.ev(node.left)
            right, ri = self.ev(node.right)
            left, right, info = self.broadcast(left, li, right, ri,
                                               isinstance(node.operator, cst.MatrixMultiply))
            return node.with_changes(left=left, right=right), info
        if isinstance(node, cst.Comparison):
            if all(isinstance(c.operator, (cst.Is, cst.IsNot)) and m.matches(
                    c.comparator, m.Name("None")) for c in node.comparisons):
                return node, Info(rank=0)  # `targets is None`: decided when tracing
            left, li = self.ev(node.left)
            comps = []
            info = li
            for c in node.comparisons:
                right, ri = self.ev(c.comparator)
                left, right, info = self.broadcast(left, li, right, ri, False)
                comps.append(c.with_changes(comparator=right))
            return node.with_changes(left=left, comparisons=comps), info
        if isinstance(node, cst.UnaryOperation):
            inner, info = self.ev(node.expression)
            return node.with_changes(expression=inner), info
        if isinstance(node, cst.IfExp):  # (NNX's tied head: hasattr(self.decoder, "kernel"))
            test = self.tied_test(node.test)
            body, bi = self.ev(node.body)
            orelse, oi = self.ev(node.orelse)
            return node.with_changes(test=test, body=body, orelse=orelse), \
                bi if bi == oi else Info(bi.batched or oi.batched)
        if isinstance(node, cst.Call):
            return self.call(node)
        if isinstance(node, (cst.Tuple, cst.List)):
            elts, infos = [], []
            for e in node.elements:
                if isinstance(e, cst.StarredElement):
                    raise EquinoxError("a starred element in a forward pass")
                v, info = self.ev(e.value)
                if info.kind == "batch_size":  # (x.shape[0] is another axis per example)
                    raise EquinoxError("the batch size in a tuple (a shape built from it)")
                infos.append(info)
                elts.append(e.with_changes(value=v))
            # batched values together (outputs, operands of concatenate/stack)
            return node.with_changes(elements=elts), Info(any(i.batched for i in infos),
                                                          kind="tuple", elements=tuple(infos))
        if isinstance(node, cst.IfExp):  # (a test of the module's settings, per example too)
            test, ti = self.ev(node.test)
            body, bi = self.ev(node.body)
            orelse, oi = self.ev(node.orelse)
            if ti.batched and not self.owner.batched:
                raise EquinoxError("a conditional expression on a batched test")
            return node.with_changes(test=test, body=body, orelse=orelse), Info(
                bi.batched or oi.batched, bi.rank if bi.rank == oi.rank else None)
        if self.owner.batched and not any(
                self.resolve(a)[1] is not None for a in findall(node, m.Attribute())):
            # NNX's code on the batch, no equinox layer in it
            return node, Info(any(self.env.get(n.value, Info()).batched
                                  for n in findall(node, m.Name())))
        # anything else: fine when nothing in it is batched
        for n in findall(node, m.Name()):
            if self.env.get(n.value, Info()).batched:
                raise EquinoxError(f"{type(node).__name__} over a batched value")
        return node, Info()

    def tied_test(self, test: cst.BaseExpression) -> cst.BaseExpression:
        """``hasattr(self.decoder, 'kernel')`` (a Linear whose weight a tie may have removed)
        -> ``self.decoder.weight is not None``; any other test as a value."""
        if m.matches(test, m.Call(func=m.Name("hasattr"), args=[m.Arg(), m.Arg(
                m.SimpleString())])) and test.args[1].value.evaluated_value == "kernel":
            layer, lay = self.resolve(test.args[0].value)
            if lay is not None and lay.kind == "linear":
                return expr("{f}.weight is not None", f=layer)
        new, info = self.ev(test)
        if info.batched:
            raise EquinoxError("a conditional expression on a batched value")
        return new

    def weight_read(self, node: cst.Attribute) -> cst.BaseExpression | None:
        """A layer's weight read in forward code: NNX's ``fc.kernel`` is torch's weight
        transposed (``fc.kernel.T`` torch's weight), an ``nnx.Embed``'s ``embedding`` torch's
        weight. equinox keeps torch's layout: ``fc.weight.T`` / ``fc.weight``."""
        transposed = node.attr.value == "T"
        read = node.value if transposed else node
        if not isinstance(read, cst.Attribute) or read.attr.value not in ("kernel", "embedding"):
            return None
        base, lay = self.resolve(read.value)
        if lay is not None and lay.kind == "conv" and read.attr.value == "kernel":
            raise EquinoxError("a convolution's kernel read in flax's layout (equinox keeps "
                               "torch's: its weight)")
        kinds = {"kernel": "linear", "embedding": "embedding"}
        if lay is None or lay.kind != kinds[read.attr.value]:
            return None
        weight = cst.Attribute(base, cst.Name("weight"))
        if lay.kind == "embedding":
            return cst.Attribute(weight, cst.Name("T")) if transposed else weight
        return weight if transposed else cst.Attribute(weight, cst.Name("T"))

    def conv_weight_read(self, node: cst.Call, name: str) -> cst.BaseExpression | None:
        """``jnp.transpose(self.conv.kernel, (3, 2, 0, 1))``: the NNX translation of torch's
        ``self.conv.weight`` read in forward code (flax's (*k, in, out) kernel put back in
        torch's (out, in, *k) order). equinox's convolution holds ``weight`` in torch's
        layout: ``self.conv.weight``."""
        if name != "jnp.transpose" or len(node.args) != 2 or any(
                a.keyword is not None or a.star for a in node.args):
            return None
        read = node.args[0].value
        if not (isinstance(read, cst.Attribute) and read.attr.value == "kernel"):
            return None
        base, lay = self.resolve(read.value)
        if lay is None or lay.kind != "conv" or lay.rank is None:
            return None
        nd = lay.rank - 1
        if try_literal(node.args[1].value, None) != (nd + 1, nd, *range(nd)):
            raise EquinoxError("a convolution's kernel with its axes permuted otherwise than "
                               "into torch's layout")
        return cst.Attribute(base, cst.Name("weight"))

    def broadcast(self, left, li: Info, right, ri: Info, matmul: bool):
        if li.merged or ri.merged or li.kind.startswith("batch_") and li.kind != "batch_size" \
                or ri.kind.startswith("batch_") and ri.kind != "batch_size":
            raise EquinoxError("arithmetic on a batch loss or on rows that merge the batch")
        if li.kind == "batch_size" or ri.kind == "batch_size":
            raise EquinoxError("arithmetic on the batch size")
        if li.channels_last or ri.channels_last:
            raise EquinoxError("arithmetic inside a channels-last region of the NNX translation")
        batched = li.batched or ri.batched
        if not batched:
            rank = None if li.rank is None or ri.rank is None else max(li.rank, ri.rank)
            hi = li if (li.rank or 0) >= (ri.rank or 0) else ri
            lead = hi.lead_one and rank is not None and (min(li.rank, ri.rank) < rank)
            return left, right, Info(rank=rank, lead_one=lead)
        b, u = (li, ri) if li.batched else (ri, li)
        if b.batched and u.batched:
            rank = None if li.rank is None or ri.rank is None else max(li.rank, ri.rank)
            return left, right, Info(True, rank)
        # an unbatched operand as long as the batched one *with* its batch axis: its leading
        # axis faced the batch; when it is known to be 1 (a broadcast buffer), drop it
        if u.rank is not None and b.rank is not None and u.rank > b.rank and not matmul:
            if u.rank == b.rank + 1 and u.lead_one:
                if li.batched:
                    right = _drop_lead(right)
                else:
                    left = _drop_lead(left)
            else:
                raise EquinoxError("an unbatched operand whose leading axis meets the batch "
                                   "axis")
        elif u.rank is None and not matmul and b.rank is None:
            pass
        rank = b.rank if u.rank is None or b.rank is None else max(b.rank, min(u.rank, b.rank))
        return left, right, Info(True, rank)

    def subscript(self, node: cst.Subscript) -> tuple[cst.BaseExpression, Info]:
        if isinstance(node.value, cst.Name) and self.env.get(
                node.value.value, Info()).kind == "layers_first" and len(node.slice) == 1 and \
                isinstance(try_literal(node.slice[0].slice.value, None) if isinstance(
                    node.slice[0].slice, cst.Index) else None, int):
            return node, Info(True, 1)  # h_n[-1]: one layer, (N, H) in torch
        value, info = self.ev(node.value)
        index = try_literal(node.slice[0].slice.value, None) if len(node.slice) == 1 and \
            isinstance(node.slice[0].slice, cst.Index) else None
        if info.elements and isinstance(index, int) and -len(info.elements) <= index < len(
                info.elements):  # an element of a layer's outputs: (out, weights)[0]
            return node.with_changes(value=value), info.elements[index]
        if info.kind == "shape":
            (el,) = node.slice
            i = int_value(el.slice.value) if isinstance(el.slice, cst.Index) else None
            if info.batched:
                if i == 0:
                    return node.with_changes(value=value), Info(kind="batch_size")
                if i is None:
                    raise EquinoxError("a computed index into the shape of a batched value")
                if i > 0:
                    el = el.with_changes(slice=cst.Index(cst.Integer(str(i - 1))))
                return node.with_changes(value=value, slice=[el]), Info(rank=0)
            return node.with_changes(value=value), Info(rank=0)
        elements = list(node.slice)
        for e in elements:
            if isinstance(e.slice, cst.Index):
                _, ii = self.ev(e.slice.value)
                if ii.batched:
                    raise EquinoxError("indexing with a batched value")
        if info.merged:
            raise EquinoxError("indexing rows that merge the batch with another axis")
        if not info.batched:
            if info.lead_one and info.rank is not None:
                return node.with_changes(value=value), Info(rank=info.rank,
                                                            lead_one=_keeps_lead(elements))
            return node.with_changes(value=value), Info()
        first = elements[0].slice
        if isinstance(first, cst.Index) and m.matches(first.value, m.Ellipsis()):
            return node.with_changes(value=value), Info(True, None)
        if not (isinstance(first, cst.Slice) and first.lower is None and first.upper is None
                and first.step is None):
            raise EquinoxError("indexing the batch axis")
        rest = elements[1:]
        if not rest:
            return value, info
        rest[-1] = rest[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return node.with_changes(value=value, slice=rest), Info(True, None)

    def call(self, node: cst.Call) -> tuple[cst.BaseExpression, Info]:
        func = node.func
        func_new, lay = self.resolve(func)
        if lay is not None:
            return self.call_layer(func_new, lay, node)
        name = code(func)
        weight = self.conv_weight_read(node, name)
        if weight is not None:
            return weight, Info()
        # tied embedding head (NNX: wte.attend(x)) -> x @ wte.weight.T
        if isinstance(func, cst.Attribute) and func.attr.value == "attend":
            emb, elay = self.resolve(func.value)
            if elay is not None and elay.kind == "embedding":
                x, info = self.ev(node.args[0].value)
                return expr("{x} @ {w}.weight.T", x=x, w=emb), Info(info.batched, info.rank)
        if (m.matches(func, m.Attribute(value=m.Name("jax"))) or m.matches(
                func, m.Attribute(value=m.Attribute(value=m.Name("jax"))))) and (
                node.args and m.matches(node.args[0].value, DRAW_KEY)):
            return self.draw(node, name)
        if m.matches(func, m.Attribute(value=m.Name("self"))) and \
                func.attr.value in self.helper_methods():
            return self.call_method(node, func.attr.value)
        # methods of arrays
        if isinstance(func, cst.Attribute) and not _is_library(func) and \
                name not in ("nnx.max_pool", "nnx.avg_pool"):
            recv, info = self.ev(func.value)
            method = func.attr.value
            if not info.batched:
                args = [a.with_changes(value=self.ev_unbatched(a.value)) for a in node.args]
                rank = None
                if method == "reshape":
                    rank = _reshape_rank(node)
                return node.with_changes(func=func.with_changes(value=recv), args=args), Info(
                    rank=rank, lead_one=method == "reshape" and rank is not None and
                    int_value(node.args[0].value) == 1)
            if info.merged:
                if method in ("mean", "sum") and not node.args:
                    # the batch loss over every row: per example the mean (sum) over its
                    # rows; the caller takes the mean (sum) over the batch, the same value as
                    # torch's when every example has as many rows
                    return node.with_changes(func=func.with_changes(value=recv)), Info(
                        True, 0, kind=f"batch_{method}")
                raise EquinoxError(f".{method}() of rows that merge the batch with another "
                                   "axis")
            if method == "reshape":
                return self.reshape(node, recv, info)
            if method in ("transpose", "permute") and node.args:
                return self.method_transpose(node, recv, info)
            if method in ("astype",):
                return node.with_changes(func=func.with_changes(value=recv)), info
            if method in AXIS_REDUCTIONS:
                args = self.shift_axes(node, kw_axes=("axis",), pos_axes=(0,))
                rank = info.rank
                if method in RANK_REDUCTIONS:
                    rank = _reduced_rank(node, info.rank, 0)
                return node.with_changes(func=func.with_changes(value=recv), args=args), \
                    Info(True, rank)
            raise EquinoxError(f"the method .{method}() of a batched value")
        if name == "jnp.pad":
            padded = self.pad(node)
            if padded is not None:
                return padded
        args = [(a, *self.ev(a.value)) for a in node.args]
        if any(i.merged for _, _, i in args):
            if name.startswith("optax.") and all(i.merged for _, _, i in args if i.batched):
                # optax's losses are per row (they reduce the class axis only): per example,
                # over its own rows, with the axes as written
                return node.with_changes(args=[a.with_changes(value=v) for a, v, _ in args]), \
                    Info(True, None, merged=True)
            raise EquinoxError(f"{name} of rows that merge the batch with another axis")
        if name == "jnp.moveaxis" and len(args) == 3 and (args[0][2].batched or
                                                          self.owner.batched):
            # the NNX pass's moves to channels-last and back: equinox layers are channel-first
            src, dst = int_value(args[1][1]), int_value(args[2][1])
            x = args[0][2]
            if (src, dst) == (1, -1) and not x.channels_last:
                return args[0][1], replace(x, channels_last=True)
            if (src, dst) == (-1, 1) and x.channels_last:
                return args[0][1], replace(x, channels_last=False)
        if name in ("nnx.max_pool", "nnx.avg_pool") and args and (
                args[0][2].batched or self.owner.batched) and args[0][2].channels_last:
            pooled = self.pool(node, args[0][1], args[0][2], name)
            if pooled is not None and self.owner.batched:  # (over the batch)
                return expr("jax.vmap({f})({x})", f=pooled[0].func, x=args[0][1]), pooled[1]
            if pooled is not None:
                return pooled
        if name in TRAILING_AXES_HELPERS and args and args[0][2].batched and not any(
                i.batched for _, _, i in args[1:]):
            # helpers over the last axes (adaptive pooling): the same call per example
            return node.with_changes(args=[a.with_changes(value=v) for a, v, _ in args]), \
                replace(args[0][2])
        short = name.split(".")[-1]
        elementwise = (name.startswith("jax.nn.") and short not in AXIS_REDUCTIONS) or (
            name.startswith("jnp.") and short in ELEMENTWISE_JNP)
        if any(i.channels_last for _, _, i in args) and not (elementwise and len(args) == 1):
            raise EquinoxError(f"{name} inside a channels-last region of the NNX translation")
        batched = [info for _, _, info in args if info.batched]
        if any(i.kind == "batch_size" for _, _, i in args):  # (repeat(t, '1 d -> b d', b=b))
            raise EquinoxError(f"the batch size given to {name}")
        new_args = [a.with_changes(value=v) for a, v, _ in args]
        call = node.with_changes(args=new_args)
        if not batched:
            rank = None
            if name == "jnp.arange":
                rank = 1
            # (a module kept batched: an elementwise function inside a channels-last region
            # stays in it)
            return call, Info(rank=rank, channels_last=any(i.channels_last
                                                           for _, _, i in args))
        first = args[0][2] if args else Info()
        short = name.split(".")[-1]
        if name.startswith("jax.nn.") or (name.startswith("jnp.") and short in ELEMENTWISE_JNP) \
                or (self.owner.attrs.get(name[5:]) is not None and name.startswith("self.")
                    and self.owner.attrs[name[5:]].kind == "fn"):
            if short in AXIS_REDUCTIONS:
                call = call.with_changes(args=self.shift_axes(call, ("axis",), ()))
                return call, Info(True, first.rank)
            # operands broadcast against each other: an unbatched one as long as a batched
            # one with its batch axis had its leading axis facing the batch
            ranks = [i.rank for _, _, i in args if i.batched]
            rank = None if None in ranks else max(ranks)
            fixed = []
            for a, v, i in args:
                if a.keyword is None and not i.batched and i.rank is not None and \
                        rank is not None and i.rank > rank:
                    if i.rank == rank + 1 and i.lead_one:
                        v = _drop_lead(v)
                    else:
                        raise EquinoxError("an unbatched operand whose leading axis meets the "
                                           "batch axis")
                fixed.append(a.with_changes(value=v))
            return call.with_changes(args=fixed), Info(True, rank, channels_last=any(
                i.channels_last for _, _, i in args))
        if name.startswith("jnp.") and (short in AXIS_REDUCTIONS or short in
                                        JNP_POSITIONAL_AXES):
            if not first.batched:
                raise EquinoxError(f"{name} with a batched operand that is not the first")
            call = call.with_changes(args=self.shift_axes(
                call, ("axis", "axis1", "axis2", "source", "destination"),
                JNP_POSITIONAL_AXES.get(short, ())))
            rank = first.rank
            if short in ("concatenate", "stack") and first.kind == "tuple":
                # the rank of the values joined (known for one of them: the same for all)
                ranks = {e.rank for e in first.elements if e.batched and e.rank is not None}
                rank = ranks.pop() if len(ranks) == 1 else None
                if rank is not None and short == "stack":
                    rank += 1
            if short in ("expand_dims",) and rank is not None:
                rank += 1
            elif short in ("squeeze",) and rank is not None:
                rank -= 1
            elif short in RANK_REDUCTIONS:
                rank = _reduced_rank(node, rank, 1)
            return call, Info(True, rank)
        if name == "jnp.transpose" and first.batched:
            axes = try_literal(node.args[1].value if len(node.args) > 1 else None, None)
            if not isinstance(axes, tuple) or not axes or axes[0] != 0:
                raise EquinoxError("a transpose that moves the batch axis")
            new = tuple(a - 1 for a in axes[1:])
            return call.with_changes(args=[new_args[0], new_args[1].with_changes(
                value=cst.parse_expression(repr(new)))]), Info(True, len(new))
        if name == "jax.lax.collapse" and first.batched:
            return self.collapse(node, new_args, first)
        if name == "jnp.einsum":
            return self.einsum(call, [i for _, _, i in args])
        if self.owner.batched and not any(self.resolve(a.value)[1] is not None
                                          for a in node.args):
            return call, Info(True, None)  # (NNX's code on the batch; no layer handed to it)
        raise EquinoxError(f"{name} on a batched value (its per-example form is not known)")

    def method_transpose(self, node: cst.Call, recv: cst.BaseExpression, info: Info
                         ) -> tuple[cst.BaseExpression, Info]:
        """``x.transpose(0, 2, 3, 1)`` (torch's ``permute``) of a batched x that keeps the batch
        axis first: the other axes, moved down by one, per example."""
        if any(a.keyword is not None or a.star for a in node.args):
            raise EquinoxError("a transpose with keyword or starred arguments")
        axes = try_literal(node.args[0].value, None) if len(node.args) == 1 else tuple(
            try_literal(a.value, None) for a in node.args)
        if not isinstance(axes, tuple) or not axes or not all(
                isinstance(a, int) and not isinstance(a, bool) for a in axes):
            raise EquinoxError("a transpose with computed axes of a batched value")
        if axes[0] != 0 or any(a < 0 for a in axes):
            raise EquinoxError("a transpose that moves the batch axis")
        if info.rank is not None and len(axes) != info.rank + 1:
            raise EquinoxError(f"a transpose of {len(axes)} axes of a value of rank "
                               f"{info.rank} per example")
        new = tuple(a - 1 for a in axes[1:])
        func = node.func.with_changes(value=recv, attr=cst.Name("transpose"))
        return cst.Call(func, [cst.Arg(cst.parse_expression(repr(new)))]), replace(
            info, rank=len(new), kind="value", elements=())

    def einsum(self, call: cst.Call, infos: list[Info]) -> tuple[cst.BaseExpression, Info]:
        """``jnp.einsum("btc,bsc->bts", q, k)`` with batched operands: per example the same
        contraction without the batch letter, ``jnp.einsum("tc,sc->ts", q, k)``. It holds
        when every batched operand starts with one letter that no unbatched operand has and
        that leads the output once (each example's output reads only its own rows); a spec
        that starts with ``...`` keeps its ellipsis (the batch is its first axis) when one
        operand is batched and no unbatched operand has one. Other specs sum over or move
        the batch, or are not shown to keep it: marked."""
        spec_arg = call.args[0] if call.args else None
        spec = try_literal(spec_arg.value, None) if spec_arg is not None and \
            spec_arg.keyword is None else None
        operands = [(a, i) for a, i in zip(call.args[1:], infos[1:], strict=True)
                    if a.keyword is None]
        if not isinstance(spec, str) or any(a.star for a in call.args) or any(
                i.batched for a, i in zip(call.args[1:], infos[1:], strict=True)
                if a.keyword is not None):
            raise EquinoxError("jnp.einsum with subscripts that are not a literal string "
                               "(whether it keeps the batch axis is not known)")
        spec = spec.replace(" ", "")
        lhs, arrow, out = spec.partition("->")
        ins = lhs.split(",")
        if len(ins) != len(operands):
            raise EquinoxError("jnp.einsum with another number of operands than subscripts")
        if not arrow:  # implicit output: the letters seen once, sorted, after the ellipsis
            letters = lhs.replace("...", "").replace(",", "")
            out = ("..." if "..." in lhs else "") + "".join(sorted(
                c for c in set(letters) if letters.count(c) == 1))
        for s, (a, i) in zip(ins, operands, strict=True):
            if i.batched and i.rank is not None and "..." not in s and len(s) != i.rank + 1:
                raise EquinoxError(f"jnp.einsum subscripts {s!r} for {code(a.value)}, of rank "
                                   f"{i.rank} per example here")
        batched = [s for s, (_, i) in zip(ins, operands, strict=True) if i.batched]
        others = [s for s, (_, i) in zip(ins, operands, strict=True) if not i.batched]
        refuse = EquinoxError("jnp.einsum that sums over or moves the batch axis (its "
                              "per-example form is not a contraction of one example)")
        if all(s.startswith("...") for s in batched):
            # one batched operand: its ellipsis, less the batch, is the same per example
            if len(batched) != 1 or not out.startswith("...") or any("..." in s
                                                                     for s in others):
                raise refuse
            new_ins, new_out, rank = ins, out, None
        else:
            b = batched[0][:1]
            if not b.isalpha() or any(s[:1] != b or s.count(b) != 1 for s in batched) or any(
                    b in s for s in others) or out[:1] != b or out.count(b) != 1:
                raise refuse
            new_ins = [s[1:] if (i.batched) else s
                       for s, (_, i) in zip(ins, operands, strict=True)]
            new_out = out[1:]
            rank = None if "..." in new_out else len(new_out)
        text = ",".join(new_ins) + "->" + new_out
        new_spec = cst.SimpleString(repr(text).replace("'", '"'))
        call = call.with_changes(args=[spec_arg.with_changes(value=new_spec), *call.args[1:]])
        return call, Info(True, rank)

    def pad(self, node: cst.Call) -> tuple[cst.BaseExpression, Info] | None:
        """``jnp.pad(x, widths)`` of a batched x, one pair per axis: per example without the
        batch axis's pair. The NNX pass writes ``[(0, 0), (0, 0), (a, b), ...]``, or
        ``[(0, 0)] * (x.ndim - k) + [(a, b), ...]`` where x's rank is not known (k pairs for the
        last k axes, whatever the rank: the same per example). None: x is not batched."""
        if len(node.args) < 2 or any(a.star for a in node.args[:2]) or \
                node.args[1].keyword is not None or not isinstance(node.args[0].value, cst.Name):
            return None
        x, info = self.ev(node.args[0].value)
        if not info.batched:
            return None
        widths = node.args[1].value
        zero = m.Tuple(elements=[m.Element(m.Integer("0")), m.Element(m.Integer("0"))])
        name = node.args[0].value.value
        if m.matches(widths, m.BinaryOperation(
                left=m.BinaryOperation(left=m.List(elements=[m.Element(zero)]),
                                       operator=m.Multiply(),
                                       right=m.BinaryOperation(
                                           left=m.Attribute(value=m.Name(name),
                                                            attr=m.Name("ndim")),
                                           operator=m.Subtract(), right=m.Integer())),
                operator=m.Add(), right=m.List())):
            if int_value(widths.left.right.right) != len(widths.right.elements):
                raise EquinoxError("jnp.pad of a batched value with widths in an unknown form")
            pairs = widths.right
            new = widths
        elif isinstance(widths, (cst.List, cst.Tuple)) and len(widths.elements) >= 2 and \
                not any(isinstance(e, cst.StarredElement) for e in widths.elements):
            if not m.matches(widths.elements[0].value, zero):
                raise EquinoxError("jnp.pad that pads the batch axis")
            pairs = widths.with_changes(elements=widths.elements[1:])
            new = pairs
            if info.rank is None:
                self._fix_input_rank(node.args[0].value, len(pairs.elements))
        else:
            raise EquinoxError("jnp.pad of a batched value with widths in an unknown form")
        for n in findall(pairs, m.Name()):
            if self.env.get(n.value, Info()).batched:
                raise EquinoxError("jnp.pad widths computed from a batched value")
        rest = [a.with_changes(value=self.ev_unbatched(a.value)) for a in node.args[2:]]
        return node.with_changes(args=[node.args[0].with_changes(value=x),
                                       node.args[1].with_changes(value=new), *rest]), \
            Info(True, info.rank, channels_last=info.channels_last)

    def pool(self, node: cst.Call, x: cst.BaseExpression, info: Info, name: str
             ) -> tuple[cst.BaseExpression, Info] | None:
        """``nnx.max_pool(x, window_shape=W, strides=S)`` (F.max_pool2d between the NNX pass's
        moves to channels-last and back, which this pass drops: ``x`` is channel-first per
        example) -> ``eqx.nn.MaxPool2d(kernel_size=W, stride=S)(x)``. None: another form."""
        kw = {a.keyword.value: a.value for a in node.args[1:] if a.keyword is not None}
        if len(node.args) - 1 != len(kw) or set(kw) - {"window_shape", "strides", "padding"}:
            return None
        window = try_literal(kw.get("window_shape"), None)
        strides = try_literal(kw["strides"], None) if "strides" in kw else window
        padding = try_literal(kw.get("padding", cst.SimpleString('"VALID"')), None)
        if not isinstance(window, tuple) or not 1 <= len(window) <= 3 or \
                not isinstance(strides, tuple) or padding != "VALID":
            return None
        which = "Max" if name == "nnx.max_pool" else "Avg"
        layer = f"eqx.nn.{which}Pool{len(window)}d(kernel_size={window!r}, stride={strides!r})"
        return expr(layer + "({x})", x=x), info

    def collapse(self, node: cst.Call, args: list[cst.Arg], first: Info
                 ) -> tuple[cst.BaseExpression, Info]:
        """``jax.lax.collapse(x, 1)`` (torch.flatten(x, 1)) of a batched x: ``jnp.ravel(x)`` per
        example; other literal axes move down by one."""
        bounds = [try_literal(a.value, None) for a in node.args[1:3]]
        if not bounds or not all(isinstance(b, int) and b >= 1 for b in bounds):
            raise EquinoxError("jax.lax.collapse of the batch axis (or of computed axes)")
        if len(bounds) == 1 and bounds[0] == 1:
            return expr("jnp.ravel({x})", x=args[0].value), Info(True, 1)
        shifted = [args[0], *(a.with_changes(value=cst.Integer(str(b - 1)))
                              for a, b in zip(args[1:3], bounds))]
        rank = None if first.rank is None or len(bounds) == 1 else \
            first.rank - 1 - (bounds[1] - bounds[0]) + 1
        return expr("jax.lax.collapse({x})", x=args[0].value).with_changes(args=shifted), \
            Info(True, rank)

    def ev_info(self, node: cst.BaseExpression) -> Info | None:
        try:
            return self.ev(node)[1]
        except EquinoxError:
            return None

    def ev_unbatched(self, node: cst.BaseExpression) -> cst.BaseExpression:
        new, info = self.ev(node)
        if info.batched:
            raise EquinoxError("a batched value as an argument")
        return new

    def shift_axes(self, node: cst.Call, kw_axes: tuple[str, ...], pos_axes: tuple[int, ...]
                   ) -> list[cst.Arg]:
        out = []
        pos_i = -1
        for a in node.args:
            if a.keyword is None:
                pos_i += 1
            target = (a.keyword is not None and a.keyword.value in kw_axes) or (
                a.keyword is None and pos_i in pos_axes)
            if target:
                a = a.with_changes(value=_shift(a.value))
            out.append(a)
        return out

    def reshape(self, node: cst.Call, recv: cst.BaseExpression, info: Info
                ) -> tuple[cst.BaseExpression, Info]:
        args = list(node.args)
        if len(args) == 1 and isinstance(args[0].value, cst.Tuple):
            els = [e.value for e in args[0].value.elements]
        else:
            els = [a.value for a in args]
        if not els:
            raise EquinoxError("reshape without a shape")
        _, first = self.ev(els[0])
        if try_literal(els[0], None) == -1 and not info.merged:
            # logits.reshape(-1, V) before a loss over every row: per example its own rows
            rest = [self.ev_unbatched(e) for e in els[1:]]
            new = cst.Call(cst.Attribute(recv, cst.Name("reshape")),
                           [cst.Arg(cst.parse_expression("-1")), *[cst.Arg(v) for v in rest]])
            return _fix_commas(new), Info(True, None, merged=True)
        if first.kind != "batch_size":
            raise EquinoxError("a reshape whose first size is not the batch size")
        rest = []
        for e in els[1:]:
            v, i = self.ev(e)
            if i.batched or i.kind == "batch_size":
                raise EquinoxError("the batch size inside a reshape")
            rest.append(v)
        if not rest:
            raise EquinoxError("a reshape to the batch size alone")
        new = cst.Call(cst.Attribute(recv, cst.Name("reshape")), [cst.Arg(v) for v in rest])
        return _fix_commas(new), Info(True, len(rest))

    # --- random draws and the module's other methods
    def draw(self, node: cst.Call, name: str) -> tuple[cst.BaseExpression, Info]:
        """``jax.random.normal(self.rngs(), x.shape, x.dtype)`` (NNX's form of torch's
        ``randn_like``): the module's NNX stream is a key the forward pass takes (one per
        example when the model is mapped over the batch, drawn from that example's shape:
        torch's elements are independent alike). Only the draws of a value's shape
        (``normal``, ``uniform``) and ``bernoulli(key, p)`` are known per example."""
        short = name.split(".")[-1]
        rest = [(a, *self.ev(a.value)) for a in node.args[1:]]
        shapes = [i for _, _, i in rest if i.kind == "shape"]
        others = [i for _, _, i in rest if i.kind != "shape" and i.batched]
        if short in ("normal", "uniform") and len(shapes) == 1 and not others and \
                rest[0][2].kind == "shape":
            out = Info(shapes[0].batched, shapes[0].rank)
        elif short == "bernoulli" and len(rest) == 1 and rest[0][0].keyword is None:
            out = replace(rest[0][2], kind="value")
        else:
            raise EquinoxError(f"{name} in a forward pass: a draw whose per-example form is "
                               "not known")
        self.owner.draws = True
        args = [node.args[0].with_changes(value=self.key()),
                *(a.with_changes(value=v) for a, v, _ in rest)]
        return node.with_changes(args=args), out

    def helper_methods(self) -> dict[str, cst.FunctionDef]:
        """The module's methods its forward may call (``self.encode(x)``)."""
        skip = {"__init__", "__call__", *self.owner.methods, *self.owner.init_methods}
        return {s.name.value: s for s in self.owner.node.body.body
                if isinstance(s, cst.FunctionDef) and s.name.value not in skip}

    def call_method(self, node: cst.Call, name: str) -> tuple[cst.BaseExpression, Info]:
        """``self.encode(x)``: the method is written like the forward pass, for the values it
        is called with (one translation for all its calls, as for a lambda), taking ``key``
        when something in it draws or calls a layer that takes one."""
        fn = self.helper_methods()[name]
        params = fn.params
        if self.owner.stateful:
            raise EquinoxError(f"self.{name}(...): a method of a module with BatchNorm state")
        if name in self.calling:
            raise EquinoxError(f"self.{name}(...): a method that calls itself")
        if any(a.star for a in node.args) or params.star_arg not in (
                cst.MaybeSentinel.DEFAULT, None) or params.kwonly_params or \
                params.star_kwarg is not None:
            raise EquinoxError(f"self.{name}(...): a method called with starred or "
                               "keyword-only arguments")
        names = [p.name.value for p in params.params[1:]]
        args = [(a, *self.ev(a.value)) for a in node.args]
        if any(i.merged for _, _, i in args):
            raise EquinoxError(f"self.{name}(...) of rows that merge the batch with another "
                               "axis")
        bound: dict[str, Info] = {}
        for i, (a, _, info) in enumerate(args):
            at = a.keyword.value if a.keyword is not None else (
                names[i] if i < len(names) else None)
            if at is None or at not in names:
                raise EquinoxError(f"self.{name}(...): an argument the method does not take")
            bound[at] = info
        sub = Forward(self.owner, self.classes, self.analyse)
        sub.calling = {*self.calling, name}
        for n in names:
            sub.env[n] = replace(bound.get(n, Info()))
        body = sub.block(list(fn.body.body))
        if sub.failed:
            raise EquinoxError(f"self.{name}(...): {sub.failed[0]}")
        outs = {repr(r) for r in sub.returns}
        if len(outs) > 1:
            raise EquinoxError(f"self.{name}(...): returns values of different ranks")
        new = fn.with_changes(body=fn.body.with_changes(body=body))
        prev = self.owner.fw_methods.get(name)
        if prev is not None and code(prev[0]) != code(new):
            raise EquinoxError(f"self.{name}(...): called with values of other ranks")
        self.owner.fw_methods[name] = (new, list(sub.key_sites))
        call_args = [a.with_changes(value=v) for a, v, _ in args]
        if sub.key_sites:
            call_args.append(cst.Arg(self.key(), keyword=cst.Name("key"), equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""),
                whitespace_after=cst.SimpleWhitespace(""))))
        return _fix_commas(node.with_changes(args=call_args)), (
            sub.returns[0] if sub.returns else Info())

    # --- statements
    def block(self, stmts: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        out: list[cst.BaseStatement] = []
        for s in stmts:
            out.extend(self.stmt(s))
        return out

    def stmt(self, s: cst.BaseStatement) -> list[cst.BaseStatement]:
        try:
            return self._stmt(s)
        except EquinoxError as exc:
            self.hoisted = []
            self.failed.append(exc.message)
            return [_todo(s, exc.message)]

    def _stmt(self, s: cst.BaseStatement) -> list[cst.BaseStatement]:
        if isinstance(s, cst.SimpleStatementLine):
            if len(s.body) != 1:
                raise EquinoxError("several statements on one line")
            small = s.body[0]
            if isinstance(small, cst.Expr) and isinstance(small.value, (
                    cst.SimpleString, cst.ConcatenatedString)):
                return [s]
            if isinstance(small, (cst.Pass, cst.Assert)):
                if isinstance(small, cst.Assert):
                    for n in findall(small, m.Name()):
                        if self.env.get(n.value, Info()).batched:
                            raise EquinoxError("an assert on a batched value")
                return [s]
            if isinstance(small, cst.Return):
                if small.value is None:
                    raise EquinoxError("a forward pass that returns nothing")
                v, info = self.ev(small.value)
                if info.channels_last or any(e.channels_last for e in info.elements):
                    raise EquinoxError("a value returned inside a channels-last region of the "
                                       "NNX translation")
                self.returns.append(info)
                outs = small.value.elements if isinstance(small.value, cst.Tuple) else ()
                for i, e in enumerate(outs):
                    kind = self.env.get(e.value.value, Info()).kind if isinstance(
                        e.value, cst.Name) else ""
                    if kind in ("batch_mean", "batch_sum"):
                        self.reduced[i] = kind[len("batch_"):]
                if info.merged or info.kind in ("batch_mean", "batch_sum") and not outs:
                    raise EquinoxError("a forward pass that returns a batch loss alone")
                new = small.with_changes(value=v)
                if self.owner.stateful:
                    new = small.with_changes(value=cst.Tuple([cst.Element(v), cst.Element(
                        cst.Name("state"))], lpar=[], rpar=[]))
                return self._flush(s.with_changes(body=[new]))
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                return self.assign(s, small)
            if isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name):
                left, li = self.ev(small.target)
                right, ri = self.ev(small.value)
                _, _, info = self.broadcast(left, li, right, ri, False)
                self.env[small.target.value] = info
                return self._flush(s.with_changes(body=[small.with_changes(value=right)]))
            if isinstance(small, cst.Expr):
                v, info = self.ev(small.value)
                return self._flush(s.with_changes(body=[small.with_changes(value=v)]))
            raise EquinoxError(f"{type(small).__name__} in a forward pass")
        if isinstance(s, cst.For):
            return self.for_loop(s)
        if isinstance(s, cst.If):
            test, info = self.ev(s.test)
            if info.batched:
                raise EquinoxError("a branch on a batched value")
            body = self.block(list(s.body.body))
            orelse = s.orelse
            if isinstance(orelse, cst.Else):
                orelse = orelse.with_changes(body=orelse.body.with_changes(
                    body=self.block(list(orelse.body.body))))
            elif orelse is not None:
                raise EquinoxError("elif in a forward pass")
            return self._flush(s.with_changes(test=test, body=s.body.with_changes(body=body),
                                              orelse=orelse))
        raise EquinoxError(f"{type(s).__name__} in a forward pass")

    def _flush(self, s: cst.BaseStatement) -> list[cst.BaseStatement]:
        hoisted, self.hoisted = self.hoisted, []
        return [*hoisted, s]

    def assign(self, s: cst.SimpleStatementLine, small: cst.Assign) -> list[cst.BaseStatement]:
        target = small.targets[0].target
        value, info = self.ev(small.value)
        if isinstance(target, cst.Tuple):
            names = [e.value for e in target.elements]
            if info.kind == "shape":
                if not all(isinstance(n, cst.Name) for n in names):
                    raise EquinoxError("unpacking a shape into something other than names")
                infos = [Info(rank=0) for _ in names]
                if info.batched:
                    infos[0] = Info(kind="batch_size")
                    kept = names[1:]
                    if not kept:
                        raise EquinoxError("unpacking only the batch size")
                    for n, i in zip(names, infos, strict=True):
                        self.env[n.value] = i
                    if info.rank is None:
                        # the rank of one example is now known from the unpacking
                        self._set_rank(small.value, len(kept))
                    if len(kept) == 1:
                        new = small.with_changes(targets=[small.targets[0].with_changes(
                            target=kept[0])], value=cst.Subscript(value, [
                                cst.SubscriptElement(cst.Index(cst.Integer("0")))]))
                    else:
                        new = small.with_changes(targets=[small.targets[0].with_changes(
                            target=target.with_changes(elements=[
                                e for e in target.elements[1:]]))], value=value)
                        els = list(new.targets[0].target.elements)
                        els[-1] = els[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                        new = new.with_changes(targets=[new.targets[0].with_changes(
                            target=new.targets[0].target.with_changes(elements=els))])
                    return self._flush(s.with_changes(body=[new]))
                for n, i in zip(names, infos, strict=True):
                    self.env[n.value] = i
                return self._flush(s.with_changes(body=[small.with_changes(value=value)]))
            self.unpack(target, info)
            return self._flush(s.with_changes(body=[small.with_changes(value=value)]))
        if not isinstance(target, cst.Name):
            raise EquinoxError("assigning to something other than a name")
        self.env[target.value] = info
        new = small.with_changes(value=value)
        chain = self._chain(value, target.value)
        if chain:
            # x = bn(conv(x)) -> x, state = bn(conv(x), state); a Sequential of modules,
            # unrolled: x, state = self.layer1[0](x, state); x, state = self.layer1[1](...)
            names = dict.fromkeys(chain, target.value)
            done = [_rename_stmt(h, names) for h in self.hoisted[-len(chain):]]
            del self.hoisted[-len(chain):]
            if not isinstance(value, cst.Name):  # x = f(__out__): x = f(x)
                done.append(_rename_stmt(s.with_changes(body=[new]), names))
            return [*self._flush(done[0]), *done[1:]]
        if isinstance(value, cst.Name) and self.hoisted and id(self.hoisted[-1]) in self.loops:
            # x = self.layer1(x): the loop over its layers rebinds x itself
            return self._loop_into(s.with_changes(body=[new]), value.value, target.value)
        if self.hoisted and len(self.hoisted) == 1:
            tmp = code(self.hoisted[0]).split(",")[0].strip()
            rest_names = {n.value for n in findall(value, m.Name())}
            if target.value not in rest_names:
                h = self.hoisted.pop()
                return [_rename_stmt(h, {tmp: target.value}),
                        _rename_stmt(s.with_changes(body=[new]), {tmp: target.value})]
        return self._flush(s.with_changes(body=[new]))

    def _loop_into(self, s: cst.SimpleStatementLine, tmp: str, target: str
                   ) -> list[cst.BaseStatement]:
        """The temporary of a loop of :meth:`loop_over` named ``target``, where ``target``
        is not read from where the temporary is set on: ``x = x`` goes."""
        at = next(i for i, h in enumerate(self.hoisted) if code(h).startswith((
            tmp + ",", tmp + " =")))
        later = {n.value for h in self.hoisted[at + 1:] for n in findall(h, m.Name())}
        if target in later:
            return self._flush(s)
        done = []
        for h in self.hoisted:
            h = _rename_stmt(h, {tmp: target})
            if not m.matches(h, m.SimpleStatementLine(body=[m.Assign(
                    targets=[m.AssignTarget(m.Name(target))], value=m.Name(target))])):
                done.append(h)
        self.hoisted = []
        return done

    def _chain(self, value: cst.BaseExpression, target: str) -> list[str]:
        """The temporaries of the last hoisted statements when they form one chain ending in
        ``value``, each statement reading the one before it and no other temporary, cut
        where a statement reads ``target``: they can all be named ``target``."""
        chain: list[str] = []
        names = {n.value for n in findall(value, m.Name())} | (
            {value.value} if isinstance(value, cst.Name) else set())
        temps = [n for n in names if n.startswith("__out")]
        if target in names or len(temps) != 1:
            return []
        name = temps[0]
        for h in reversed(self.hoisted):
            if not name.startswith("__out") or not code(h).startswith((name + ",",
                                                                       name + " =")):
                break
            chain.append(name)
            reads = {n.value for n in findall(h.body[0].value, m.Name())}
            temps = {n for n in reads if n.startswith("__out")}
            if target in reads or len(temps) != 1:
                break
            name = temps.pop()
        return chain[::-1]

    def unpack(self, target: cst.Tuple, info: Info) -> None:
        """``a, (b, c) = value``: each name gets its element's info when the tuple's elements
        are known (a layer's outputs), else the tuple's (``q, k, v = split(...)``)."""
        names = [e.value for e in target.elements]
        known = len(info.elements) == len(names)
        for i, n in enumerate(names):
            part = info.elements[i] if known else replace(info, kind="value", elements=())
            if isinstance(n, cst.Tuple):
                self.unpack(n, part)
            elif isinstance(n, cst.Name):
                self.env[n.value] = part
            else:
                raise EquinoxError("unpacking into something other than names")

    def _set_rank(self, shape_expr: cst.BaseExpression, rank: int) -> None:
        if isinstance(shape_expr, cst.Attribute) and isinstance(shape_expr.value, cst.Name):
            name = shape_expr.value.value
            if name in self.env:
                self.env[name] = replace(self.env[name], rank=rank)

    def dict_loop(self, s: cst.For) -> list[cst.BaseStatement] | None:
        """``for name, layer in self.heads.items():`` (or ``.values()``) over a ModuleDict of
        layers of one kind: a loop over its keys in torch's order, written out, since jax
        rebuilds a dict attribute with its keys sorted."""
        if not m.matches(s.iter, m.Call(func=m.Attribute(attr=m.Name("items") | m.Name(
                "values")), args=[])):
            return None
        base, lay = self.resolve(s.iter.func.value)
        if lay is None or lay.kind != "dict":
            return None
        items = list(lay.items.values())
        if not items or len({(p.kind, p.cls, p.stateful, p.keyed) for p in items}) != 1:
            raise EquinoxError("a loop over a ModuleDict whose layers are not all of one kind")
        if s.iter.func.attr.value == "items":
            if not m.matches(s.target, m.Tuple([m.Element(m.Name()), m.Element(m.Name())])):
                raise EquinoxError("a loop over ModuleDict.items() not unpacked into two names")
            key, layer = (e.value.value for e in s.target.elements)
        elif isinstance(s.target, cst.Name):
            key, layer = f"{s.target.value}_key", s.target.value
        else:
            raise EquinoxError("a loop over ModuleDict.values() not bound to one name")
        keys = "(" + ", ".join(f'"{k}"' for k in lay.items) + ("," if len(lay.items) == 1
                                                              else "") + ")"
        kind = f"layer:{layer}"
        self.loop_layers = {**self.loop_layers, kind: items[0]}
        self.env[layer] = Info(kind=kind)
        self.env[key] = Info()
        self.loop_depth += 1
        body = self.block(list(s.body.body))
        self.loop_depth -= 1
        bind = cst.parse_statement(f"{layer} = {code(base)}[{key}]\n")
        return [s.with_changes(target=cst.Name(key), iter=cst.parse_expression(keys),
                               body=s.body.with_changes(body=[bind, *body]))]

    def for_loop(self, s: cst.For) -> list[cst.BaseStatement]:
        done = self.dict_loop(s)
        if done is not None:
            return done
        it, lay = self.resolve(s.iter)
        unpacked = self.unpacked_layers(s, lay)
        if unpacked is not None:
            return unpacked
        unrolled = unrolled_loop(self, s, it, lay)  # (layers of several forms)
        if unrolled is not None:
            return unrolled
        if lay is None or lay.kind != "list" or not isinstance(s.target, cst.Name):
            _, info = self.ev(s.iter)
            if info.batched:
                raise EquinoxError("a loop over a batched value")
            if not _calls_unknown_layers(s, lay):
                self.loop_depth += 1
                body = self.block(list(s.body.body))
                self.loop_depth -= 1
                return [s.with_changes(body=s.body.with_changes(body=body))]
            # (an attribute of unknown kind whose elements the body calls: layers handed in;
            # on a batch each is called through on_batch, per example its form is not known)
            lay = Layer("list", passed=True)
        element = lay.items.get("*") or next(iter(lay.items.values()), None)
        if element is None and self.owner.batched:
            element = lay.mixed  # (layers of several kinds, called alike on a batch)
        if element is None and self.owner.batched and lay.passed:
            element = Layer("value", passed=True)  # (no call of the file shows them)
        if element is None:
            raise EquinoxError("a loop over a list of unknown layers")
        kind = f"layer:{s.target.value}"
        self.loop_layers = {**self.loop_layers, kind: element}
        self.env[s.target.value] = Info(kind=kind)
        self.loop_depth += 1
        body = self.block(list(s.body.body))
        self.loop_depth -= 1
        return [s.with_changes(iter=it, body=s.body.with_changes(body=body))]


    def unpacked_layers(self, s: cst.For, lay: Layer | None) -> list[cst.BaseStatement] | None:
        """``for block1, block2, attn, down in self.downs:`` over a list of lists, each of
        layers of one form per position (one Layer per position: equinox_init.if_layer for
        the positions that differ by stage): each name is its position's layer. None: not
        such a loop."""
        if lay is None or lay.kind != "list" or not m.matches(s.target, m.Tuple(
                elements=[m.ZeroOrMore(m.Element(m.Name()))])):
            return None
        rows = list(lay.items.values())
        names = [e.value.value for e in s.target.elements]
        if not rows or any(r.kind != "list" or sorted(r.items) != sorted(
                map(str, range(len(names)))) for r in rows) or len({tuple(
                    (p.kind, p.cls, p.alts) for _, p in sorted(r.items.items()))
                                                                    for r in rows}) != 1:
            raise EquinoxError("a loop over a list of lists whose layers are not known here")
        layers = dict(self.loop_layers)
        for i, n in enumerate(names):
            layers[f"layer:{n}"] = rows[0].items[str(i)]
            self.env[n] = Info(kind=f"layer:{n}")
        self.loop_layers = layers
        self.loop_depth += 1
        body = self.block(list(s.body.body))
        self.loop_depth -= 1
        return [s.with_changes(body=s.body.with_changes(body=body))]


def _calls_unknown_layers(s: cst.For, lay: Layer | None) -> bool:
    """``for layer in self.layers: x = layer(x)`` over an attribute whose layers are not known
    here (a value handed to the constructor)."""
    return (lay is None or lay.kind == "value") and isinstance(s.target, cst.Name) and \
        m.matches(s.iter, m.Attribute(value=m.Name("self"))) and bool(findall(
            s.body, m.Call(func=m.Name(s.target.value))))


def _is_library(func: cst.BaseExpression) -> bool:
    """``jnp.x`` / ``jax.nn.x`` / ``math.x``: a function of a library, not a method."""
    while isinstance(func, cst.Attribute):
        func = func.value
    return isinstance(func, cst.Name) and func.value in ("jnp", "jax", "math", "np", "eqx",
                                                           "optax")


def _shift(node: cst.BaseExpression) -> cst.BaseExpression:
    """An axis of a batched value -> the same axis of one example."""
    value = try_literal(node, None)
    if isinstance(value, int) and not isinstance(value, bool):
        if value == 0:
            raise EquinoxError("an operation over the batch axis (axis 0)")
        return cst.parse_expression(repr(value - 1 if value > 0 else value))
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        if 0 in value:
            raise EquinoxError("an operation over the batch axis (axis 0)")
        return cst.parse_expression(repr(tuple(v - 1 if v > 0 else v for v in value)))
    raise EquinoxError(f"a computed axis ({code(node)}) of a batched value")


def _reduced_rank(node: cst.Call, rank: int | None, axis_pos: int) -> int | None:
    """The per-example rank after a reduction of a batched value (``x.mean(axis=(2, 3))``,
    ``jnp.sum(x, 1)``): one less per literal axis, unchanged with ``keepdims=True``; None
    where not known. Without an axis the reduction takes the batch axis too: refused."""
    kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    pos = [a.value for a in node.args if a.keyword is None]
    axis = kw.get("axis", pos[axis_pos] if len(pos) > axis_pos else None)
    if axis is None or m.matches(axis, m.Name("None")):
        raise EquinoxError("a reduction over every axis of a batched value (the batch "
                           "included)")
    keep = try_literal(kw["keepdims"], None) if "keepdims" in kw else False
    if keep is None or rank is None:
        return None
    if keep:
        return rank
    axes = try_literal(axis, None)
    n = 1 if isinstance(axes, int) else len(axes) if isinstance(axes, tuple) else None
    return rank - n if n is not None else None


def _drop_lead(node: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(node, cst.Comparison) and isinstance(node.left, cst.Subscript) and all(
            isinstance(try_literal(c.comparator, None), (int, float)) for c in node.comparisons):
        return node.with_changes(left=_drop_lead(node.left))
    if isinstance(node, cst.Subscript):
        first = node.slice[0].slice
        if isinstance(first, cst.Slice) and first.lower is None and first.upper is None:
            return node.with_changes(slice=[node.slice[0].with_changes(
                slice=cst.Index(cst.Integer("0"))), *node.slice[1:]])
    if not isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        node = node.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.Subscript(node, [cst.SubscriptElement(cst.Index(cst.Integer("0")))])


def _keeps_lead(elements) -> bool:
    first = elements[0].slice
    return isinstance(first, cst.Slice) and first.lower is None and first.upper is None


def _reshape_rank(node: cst.Call) -> int | None:
    if len(node.args) == 1 and isinstance(node.args[0].value, cst.Tuple):
        return len(node.args[0].value.elements)
    return len(node.args) or None
