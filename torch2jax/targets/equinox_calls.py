"""The equinox target's per-example forward code: calls of layers and submodules.

The layer half of :class:`~torch2jax.targets.equinox_forward.Forward`, which inherits it:
per-call keys, stateful calls (BatchNorm), layers mapped over the leading axes that remain,
attention, recurrent layers and cells. The methods use the state that ``Forward.__init__``
sets up (``env``, ``owner``, ``hoisted``, ...).
"""

from __future__ import annotations

from dataclasses import replace

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes.common import code, expr, is_identity_lambda, is_simple, try_literal
from torch2jax.targets.equinox_init import ClassInfo, _init_of, _rename_stmt
from torch2jax.targets.equinox_layers import (
    KEY,
    RNN_NAMES,
    VECTOR_LAYERS,
    EquinoxError,
    Info,
    Layer,
    _fix_commas,
    _kwarg,
    channel_first_seq,
    einops_ranks,
)


class LayerCalls:
    """Forward's calls of layers and submodules (the methods read and write the state
    that ``Forward.__init__`` sets up)."""

    # --- keys and state
    def key(self) -> cst.Name:
        name = KEY.format(len(self.key_sites) + 1)
        self.key_sites.append(name if not self.loop_depth else name + "loop")
        return cst.Name(self.key_sites[-1])

    def stateful_call(self, call: cst.Call, at: int | None = None) -> cst.Name:
        self.fresh += 1
        tmp = f"__out{self.fresh}__"
        state_arg = cst.Arg(cst.Name("state"))
        # after the positional arguments: a converted module's __call__ takes state after its
        # required parameters (``at`` of them), before those with defaults
        n = next((i for i, a in enumerate(call.args) if a.keyword is not None or a.star),
                 len(call.args))
        n = n if at is None else min(n, at)
        call = call.with_changes(args=[*call.args[:n], state_arg, *call.args[n:]]) \
            if call.args else call
        call = _fix_commas(call)
        self.hoisted.append(cst.parse_statement(f"{tmp}, state = {code(call)}\n"))
        return cst.Name(tmp)

    # --- layers
    def resolve(self, node: cst.BaseExpression) -> tuple[cst.BaseExpression, Layer | None]:
        """``self.a`` / ``self.d.k`` / a loop name -> the equinox expression and its layer."""
        if isinstance(node, cst.Name):
            info = self.env.get(node.value)
            if info is not None and info.kind.startswith("layer:"):
                return node, self._layer_from_kind(info.kind)
            return node, None
        if isinstance(node, cst.Attribute) and m.matches(node.value, m.Name("self")):
            return node, self.owner.attrs.get(node.attr.value)
        if isinstance(node, cst.Attribute):
            base, lay = self.resolve(node.value)
            if lay is not None and lay.kind == "dict":
                key = node.attr.value
                return cst.Subscript(base, [cst.SubscriptElement(cst.Index(
                    cst.SimpleString(f'"{key}"')))]), lay.items.get(key)
            return node, None
        if isinstance(node, cst.Subscript):
            base, lay = self.resolve(node.value)
            if lay is not None and lay.kind == "list":
                return node.with_changes(value=base), lay.items.get("*") or next(
                    iter(lay.items.values()), None)
            key = try_literal(node.slice[0].slice.value, None) if len(node.slice) == 1 and \
                isinstance(node.slice[0].slice, cst.Index) else None
            if lay is not None and lay.kind == "dict" and isinstance(key, str):
                return node.with_changes(value=base), lay.items.get(key)  # self.heads["a"]
        return node, None

    def _layer_from_kind(self, kind: str) -> Layer | None:
        return self.loop_layers.get(kind)

    def call_layer(self, func: cst.BaseExpression, lay: Layer, node: cst.Call) -> tuple[
            cst.BaseExpression, Info]:
        if self.owner.batched:
            return self.batched_call(func, lay, node)
        if lay.kind == "mha":
            return self.call_attention(func, lay, node)
        if lay.kind == "torchlstm":  # (h, c) hold the batch on axis 1: the module is batched
            raise EquinoxError("a stacked LSTM: its states (num_layers, N, H) hold the batch "
                               "on axis 1")
        if lay.kind in RNN_NAMES:
            raise EquinoxError(f"an {RNN_NAMES[lay.kind]} call in another form than torch's "
                               "(output, state) unpacked")
        args = [a for a in node.args]
        if (len(args) != 1 or args[0].keyword or args[0].star) and lay.kind != "module":
            raise EquinoxError(f"a {lay.kind} layer called with several arguments")
        values = [self.ev(a.value) for a in args]
        new_args = [a.with_changes(value=v[0]) for a, v in zip(args, values, strict=True)]
        infos = [v[1] for v in values]
        if any(i.merged for i in infos):
            # (per example the rows are the example's alone: what the layer returns would
            # not be torch's rows of the whole batch)
            raise EquinoxError(f"a {lay.kind} layer on rows that merge the batch with another "
                               "axis")
        x = infos[0] if infos else Info()
        if lay.kind in VECTOR_LAYERS:
            need = VECTOR_LAYERS[lay.kind]
            if x.channels_last:
                raise EquinoxError(f"a {lay.kind} layer inside a channels-last region")
            if x.rank is None and not x.is_input and x.batched:
                # the rank per example is not known here: the layer mapped over whatever
                # leading axes the value has when traced (a helper written into the file)
                out = Info(True, None)
                return expr("over_leading({f}, {x}, {n})", f=func, x=new_args[0].value,
                            n=cst.Integer(str(need))), out
            rank = x.rank if x.rank is not None else need
            self._fix_input_rank(args[0].value, rank, lay.kind)
            if rank < need:
                raise EquinoxError(f"a {lay.kind} layer applied to a value of rank {rank}")
            f: cst.BaseExpression = func
            for _ in range(rank - need):
                f = expr("jax.vmap({f})", f=f)
            out = Info(x.batched, rank + (1 if lay.kind == "embedding" else 0))
            return cst.Call(f, new_args), out
        if lay.kind in ("conv", "pool"):
            if x.rank is not None and x.rank != lay.rank:
                raise EquinoxError(f"a {lay.kind} layer applied to a value of rank {x.rank} "
                                   f"per example (it takes {lay.rank}: channels first)")
            self._fix_input_rank(args[0].value, lay.rank)
            return cst.Call(func, new_args), Info(x.batched, lay.rank,
                                                  channels_last=x.channels_last)
        if lay.kind == "groupnorm":  # channel first, any number of spatial axes
            return cst.Call(func, new_args), Info(x.batched, x.rank,
                                                  channels_last=x.channels_last)
        if lay.kind == "bn":
            if not x.batched:
                raise EquinoxError("BatchNorm on a value that is not per example")
            return self.stateful_call(cst.Call(func, new_args)), Info(
                True, x.rank, channels_last=x.channels_last)
        if lay.kind == "resize":  # (written for one example: channel-first, any rank)
            ranks = einops_ranks(lay.node)  # (an einops layer's: the ranks of its pattern)
            if ranks is not None and ranks[0] is not None and x.rank not in (None, ranks[0]):
                raise EquinoxError(f"an einops layer for rank {ranks[0]} applied to a value of "
                                   f"rank {x.rank} per example")
            if ranks is not None and ranks[0] is not None:
                self._fix_input_rank(args[0].value, ranks[0])
            return cst.Call(func, new_args), Info(
                x.batched, x.rank if ranks is None else ranks[1], channels_last=x.channels_last)
        channel_first = lay.kind == "seq" and bool(lay.items) and all(
            p.kind in ("conv", "bn", "pool", "fn", "resize", "dropout", "groupnorm")
            for p in lay.items.values())
        if x.channels_last and lay.kind not in ("fn", "dropout") and not channel_first:
            raise EquinoxError(f"a {lay.kind} layer inside a channels-last region")
        if lay.kind == "dropout":
            call = cst.Call(func, [*new_args, _kwarg("key", self.key())])
            return _fix_commas(call), replace(x)
        if lay.kind == "fn":
            return cst.Call(func, new_args), replace(x)
        if lay.kind == "lambda" and isinstance(func, cst.Attribute):
            return cst.Call(func, new_args), self.call_lambda(func.attr.value, lay.node, infos)
        if lay.kind == "seq":
            first = lay.items.get("0")
            if first is None or any(p.kind == "value" for p in lay.items.values()):
                raise EquinoxError("a Sequential whose layers are not known here")
            vmaps = 0
            if first.kind in VECTOR_LAYERS and x.rank is not None and \
                    x.rank > VECTOR_LAYERS[first.kind]:
                # a sequence of vectors: map the whole Sequential over the leading axes
                if lay.keyed or lay.stateful or not all(
                        p.kind in ("linear", "fn", "layernorm") for p in lay.items.values()):
                    raise EquinoxError("a Sequential with dropout or state applied to a "
                                       f"sequence (rank {x.rank} per example)")
                vmaps = x.rank - VECTOR_LAYERS[first.kind]
            # (a function for one example that returns a vector, nn.Flatten's, may come
            # before vector layers: equinox's Sequential hands them one vector each)
            reshaped = [(einops_ranks(p.node) or (None, None))[1]
                        for p in (lay.items.get(str(i)) for i in range(len(lay.items)))
                        if p is not None and p.kind == "resize"]
            if (any(p.kind in ("conv", "pool", "bn") for p in lay.items.values()) or any(
                    r != 1 for r in reshaped)) and any(p.kind in VECTOR_LAYERS
                                                       for p in lay.items.values()):
                # (an einops layer making vectors of an image, then vector layers: each
                # layer called as it is, on the value as that layer sees it)
                return self.unroll(func, lay, new_args[0].value, x)
            if any(p.kind == "module" for p in lay.items.values()):
                if lay.loop:
                    return self.loop_over(func, lay, new_args[0].value, x)
                return self.unroll(func, lay, new_args[0].value, x)
            rank = x.rank
            if rank is None and first is not None and first.kind in VECTOR_LAYERS:
                if not x.is_input:  # (each layer called as it is: mapped where it needs)
                    return self.unroll(func, lay, new_args[0].value, x)
                rank = VECTOR_LAYERS[first.kind]
                self._fix_input_rank(args[0].value, rank, first.kind)
            for _ in range(vmaps):
                func = expr("jax.vmap({f})", f=func)
            call = cst.Call(func, new_args)
            if lay.keyed:
                call = _fix_commas(call.with_changes(args=[*call.args, _kwarg("key",
                                                                              self.key())]))
            out = Info(x.batched, rank, channels_last=x.channels_last)
            if channel_first and x.rank is None:
                out.rank = next((p.rank for p in lay.items.values()
                                 if p.kind in ("conv", "pool") and p.rank), None)
                if out.rank is not None and x.is_input:
                    self._fix_input_rank(args[0].value, out.rank)
            if any(r is not None for r in reshaped):  # (the layers after keep its rank)
                out.rank = [r for r in reshaped if r is not None][-1]
            if lay.stateful:
                return self.stateful_call(call), out
            return call, out
        if lay.kind == "module":
            sub = self.classes[lay.cls]
            self.callees.append((lay.cls, infos))
            out = self.analyse(lay.cls, infos)
            call = cst.Call(func, new_args)
            if sub.keyed:
                call = _fix_commas(call.with_changes(args=[*call.args, _kwarg("key",
                                                                              self.key())]))
            if sub.stateful:
                return self.stateful_call(call, _required(sub)), out or Info(x.batched)
            return call, out or Info(x.batched)
        raise EquinoxError(f"{code(func)} is not a layer the equinox target translated")

    def unroll(self, func: cst.BaseExpression, lay: Layer, value: cst.BaseExpression,
               x: Info) -> tuple[cst.BaseExpression, Info]:
        """A Sequential holding the file's own modules, called block by block
        (``self.layer1[0](x, state)``, ...): ``eqx.nn.Sequential`` passes its state only to
        ``StatefulLayer``s and a key to every layer, which converted modules are not written
        for."""
        for i in range(len(lay.items)):
            p = lay.items.get(str(i))
            if p is None:
                raise EquinoxError("a Sequential whose layers are not known here")
            if not isinstance(value, cst.Name):
                self.fresh += 1
                tmp = f"__out{self.fresh}__"
                self.hoisted.append(cst.parse_statement(f"{tmp} = {code(value)}\n"))
                value = cst.Name(tmp)
            self.env[value.value] = x
            item = cst.Subscript(func, [cst.SubscriptElement(cst.Index(cst.Integer(str(i))))])
            value, x = self.call_layer(item, p, cst.Call(item, [cst.Arg(value)]))
        return value, x

    def loop_over(self, func: cst.BaseExpression, lay: Layer, value: cst.BaseExpression,
                  x: Info) -> tuple[cst.BaseExpression, Info]:
        """A Sequential of the file's own modules built in a loop (how many is not known
        here), all of one class: a loop over its layers, ``for block in self.layer1.layers:
        x, state = block(x, state)`` (a key split off per iteration where they take one)."""
        parts = list(lay.items.values())
        first = parts[0]
        if any(p.kind != "module" or (p.cls, p.alts) != (first.cls, first.alts)
               for p in parts):
            raise EquinoxError("a Sequential built in a loop from layers of different "
                               "classes: how many of each it holds is not known here")
        if not (isinstance(value, cst.Name) and value.value.startswith("__out")):
            self.fresh += 1  # the loop rebinds a temporary, not a name of the function
            tmp = f"__out{self.fresh}__"
            self.hoisted.append(cst.parse_statement(f"{tmp} = {code(value)}\n"))
            value = cst.Name(tmp)
        call = _init_of(self.owner.node, "__call__")
        taken = {n.value for n in findall(call, m.Name())} if call is not None else set()
        name, i = "block", 1
        while name in taken:
            i += 1
            name = f"block{i}"
        self.env[value.value] = x
        outer, self.hoisted = self.hoisted, []
        self.loop_depth += 1
        try:
            out, info = self.call_layer(cst.Name(name), first, cst.Call(cst.Name(name), [
                cst.Arg(value)]))
        finally:
            self.loop_depth -= 1
            inner, self.hoisted = self.hoisted, outer
        if isinstance(out, cst.Name) and inner and code(inner[-1]).startswith(out.value + ","):
            inner[-1] = _rename_stmt(inner[-1], {out.value: value.value})
        else:
            inner.append(cst.parse_statement(f"{value.value} = {code(out)}\n"))
        loop = cst.For(cst.Name(name), expr("{f}.layers", f=func), cst.IndentedBlock(inner))
        self.hoisted.append(loop)
        self.loops.add(id(loop))
        return value, info

    def sequence_input(self, node: cst.BaseExpression, what: str) -> cst.BaseExpression:
        """A (L, E) sequence per example: torch's (N, L, E), batch first."""
        if m.matches(node, m.Call(func=m.Attribute(value=m.Name("jnp"),
                                                   attr=m.Name("moveaxis")))):
            raise EquinoxError(f"{what} with batch_first=False: its batch is axis 1, and the "
                               "equinox model is mapped over axis 0 (batch_first=True is "
                               "translated)")
        new, info = self.ev(node)
        if not info.batched or info.rank not in (None, 2):
            raise EquinoxError(f"{what} applied to a value that is not a sequence per example")
        self._fix_input_rank(node, 2)
        return new

    def call_attention(self, func: cst.BaseExpression, lay: Layer, node: cst.Call) -> tuple[
            cst.BaseExpression, Info]:
        """NNX ``attn(q, k, v, mask=M)`` (batch first) -> ``attn(q, k, v, mask=M')`` per
        example: equinox takes all three, and a (L, S) mask (True = attend, as flax's)."""
        pos = [a.value for a in node.args if a.keyword is None and not a.star]
        kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if len(pos) + len(kw) != len(node.args) or set(kw) - {"mask"} or not 1 <= len(pos) <= 3:
            raise EquinoxError("MultiheadAttention called with other arguments")
        qkv = [self.sequence_input(p, "MultiheadAttention") for p in pos]
        qkv += [qkv[-1]] * (3 - len(qkv))
        args = [cst.Arg(v) for v in qkv]
        if "mask" in kw:
            args.append(_kwarg("mask", self.attention_mask(kw["mask"], qkv[0], qkv[1])))
        if lay.keyed:
            args.append(_kwarg("key", self.key()))
        return _fix_commas(cst.Call(func, args)), Info(True, 2)

    def attention_mask(self, node: cst.BaseExpression, q: cst.BaseExpression,
                       k: cst.BaseExpression) -> cst.BaseExpression:
        """The NNX pass's mask (``~attn_mask``, ``~key_padding_mask[..., None, None, :]``,
        both joined by ``jnp.logical_and``) for one example: torch's (L, S) attn_mask is
        shared by the examples, a key padding mask is the example's (S,) row, broadcast."""
        parts = list(node.args) if m.matches(node, m.Call(func=m.Attribute(
            value=m.Name("jnp"), attr=m.Name("logical_and")))) else [cst.Arg(node)]
        out, padded = [], False
        for part in (a.value for a in parts):
            if m.matches(part, m.UnaryOperation(operator=m.BitInvert(), expression=m.IfExp())):
                value, info = self.ev(part.expression.orelse)
                if info.batched or info.rank == 3:
                    raise EquinoxError("a (N * num_heads, L, S) attn_mask: the batch is merged "
                                       "with the heads (a (L, S) mask is translated)")
                out.append(expr("~{m}", m=value))
            elif m.matches(part, m.UnaryOperation(operator=m.BitInvert(), expression=m.Subscript(
                    slice=[m.SubscriptElement(m.Index(m.Ellipsis())), m.ZeroOrMore()]))):
                value, info = self.ev(part.expression.value)
                if not info.batched:
                    raise EquinoxError("a key_padding_mask that is not per example")
                out.append(expr("~{m}", m=value))
                padded = True
            else:
                raise EquinoxError("a MultiheadAttention mask in an unknown form")
        mask = out[0] if len(out) == 1 else expr("jnp.logical_and({a}, {b})", a=out[0],
                                                 b=out[1])
        if not padded:
            return mask
        if not (is_simple(q) and is_simple(k)):
            raise EquinoxError("a key_padding_mask with a compound query or key (assign them "
                               "to names first)")
        return expr("jnp.broadcast_to({m}, ({q}.shape[0], {k}.shape[0]))", m=mask, q=q, k=k)

    def lstm(self, node: cst.BaseExpression) -> tuple[cst.BaseExpression, Info] | None:
        """NNX's LSTM call forms -> ``lstm_scan(self.lstm, x)``, torch's ``(output, (h_n,
        c_n))`` for one example: ``(rnn(x), None)`` (the output alone used) and
        ``(lambda carry, out: ...)(*rnn(x, return_carry=True))``. None: not an LSTM call."""
        if m.matches(node, m.Tuple(elements=[m.Element(m.Call()), m.Element(m.Name("None"))])):
            call = node.elements[0].value
        elif m.matches(node, m.Call(func=m.Lambda(), args=[m.Arg(star="*", value=m.Call())])):
            call = node.args[0].value
        else:
            return None
        func, lay = self.resolve(call.func)
        if lay is None or lay.kind not in ("lstm", "gru"):
            return None
        what = RNN_NAMES[lay.kind]
        kw = {a.keyword.value for a in call.args if a.keyword is not None}
        if kw - {"return_carry"} or len(call.args) != 1 + len(kw):
            raise EquinoxError(f"an {what} called with a state: torch's is (num_layers, N, H), "
                               "the batch on axis 1 (the zero state is translated)")
        x = self.sequence_input(call.args[0].value, what)
        state = Info(True, 2, kind="layers_first")
        if lay.kind == "lstm":
            state = Info(True, kind="tuple", elements=(state, state))
        # the whole torch structure, whichever parts the NNX form kept
        return expr(f"{lay.kind}_scan({{f}}, {{x}})", f=func, x=x), Info(
            True, kind="tuple", elements=(Info(True, 2), state))

    def lstm_cell(self, node: cst.Subscript) -> tuple[cst.BaseExpression, Info] | None:
        """NNX's ``cell((c, h), x)[0][::-1]`` -> equinox's ``cell(x, (h, c))``, torch's
        ``(h', c')``; without torch's hx, zeros of one example's hidden size."""
        if not m.matches(node, m.Subscript(
                value=m.Subscript(value=m.Call(args=[m.Arg(m.Tuple()), m.Arg()]),
                                  slice=[m.SubscriptElement(m.Index(m.Integer("0")))]),
                slice=[m.SubscriptElement(m.Slice(lower=None, upper=None))])):
            return None
        call = node.value.value
        func, lay = self.resolve(call.func)
        if lay is None or lay.kind != "lstmcell":
            return None
        x, info = self.ev(call.args[1].value)
        if not info.batched or info.rank not in (None, 1):
            raise EquinoxError("an LSTMCell applied to a value that is not a vector per example")
        self._fix_input_rank(call.args[1].value, 1)
        c, h = (e.value for e in call.args[0].value.elements)
        if code(c) == code(h) and code(c).startswith("jnp.zeros((*"):
            zero = expr("jnp.zeros({f}.hidden_size, {x}.dtype)", f=func, x=x)
            state = [zero, zero]
        else:
            state = []
            for v in (h, c):
                new, i = self.ev(v)
                if not i.batched or i.rank not in (None, 1):
                    raise EquinoxError("an LSTMCell state that is not a vector per example")
                state.append(new)
        return expr("{f}({x}, ({h}, {c}))", f=func, x=x, h=state[0], c=state[1]), Info(
            True, kind="tuple", elements=(Info(True, 1), Info(True, 1)))

    def gru_cell(self, node: cst.Subscript) -> tuple[cst.BaseExpression, Info] | None:
        """NNX's ``cell(h, x)[0]`` -> equinox's ``cell(x, h)``, torch's h'; without torch's
        hx, zeros of one example's hidden size."""
        if not m.matches(node, m.Subscript(
                value=m.Call(args=[m.Arg(keyword=None), m.Arg(keyword=None)]),
                slice=[m.SubscriptElement(m.Index(m.Integer("0")))])):
            return None
        call = node.value
        func, lay = self.resolve(call.func)
        if lay is None or lay.kind != "grucell":
            return None
        x, info = self.ev(call.args[1].value)
        if not info.batched or info.rank not in (None, 1):
            raise EquinoxError("a GRUCell applied to a value that is not a vector per example")
        self._fix_input_rank(call.args[1].value, 1)
        h = call.args[0].value
        if code(h).startswith("jnp.zeros((*"):
            h = expr("jnp.zeros({f}.hidden_size, {x}.dtype)", f=func, x=x)
        else:
            h, i = self.ev(h)
            if not i.batched or i.rank not in (None, 1):
                raise EquinoxError("a GRUCell state that is not a vector per example")
        return expr("{f}({x}, {h})", f=func, x=x, h=h), Info(True, 1)

    # --- a module kept batched (its per-example form was not shown)
    def batched_call(self, func: cst.BaseExpression, lay: Layer, node: cst.Call) -> tuple[
            cst.BaseExpression, Info]:
        """A layer called in a module whose code keeps torch's batch axis (ClassInfo.batched):
        an equinox layer, written for one example, mapped over the leading axes (``jax.vmap``
        over the batch for the channel-first layers, ``over_leading`` for vector layers, whose
        inputs may carry more leading axes); dropout, elementwise, on the whole batch with
        one key; the file's own modules, batched as well, called as they are."""
        args = [a for a in node.args]
        if lay.kind == "value" and lay.passed:
            # a module handed to the constructor that no call in the file shows: mapped over
            # the batch when it is written for one example (a helper written into the file)
            values = [self.ev(a.value)[0] for a in args]
            return _fix_commas(cst.Call(cst.Name("on_batch"), [cst.Arg(func), *(
                a.with_changes(value=v) for a, v in zip(args, values, strict=True))])), Info()
        if lay.kind == "torchlstm" and len(args) in (1, 2) and not any(
                a.keyword or a.star for a in args):  # torch's call: input, (h_0, c_0)
            call = cst.Call(func, [a.with_changes(value=self.ev(a.value)[0]) for a in args])
            return (_fix_commas(call.with_changes(args=[*call.args, _kwarg(
                "key", self.key())])) if lay.keyed else call), Info()
        if lay.kind != "module" and (len(args) != 1 or args[0].keyword or args[0].star):
            raise EquinoxError(f"a {lay.kind} layer called with several arguments")
        values = [self.ev(a.value) for a in args]
        new_args = [a.with_changes(value=v[0]) for a, v in zip(args, values, strict=True)]
        infos = [v[1] for v in values]
        x = infos[0] if infos else Info()
        channel_first = lay.kind == "seq" and bool(lay.items) and all(
            p.kind in ("conv", "bn", "pool", "fn", "resize", "dropout", "groupnorm")
            for p in lay.items.values())
        if x.channels_last and not channel_first and lay.kind not in (
                "conv", "pool", "groupnorm", "bn", "dropout", "resize", "fn"):
            raise EquinoxError(f"a {lay.kind} layer inside a channels-last region")
        if lay.kind in VECTOR_LAYERS:
            return expr("over_leading({f}, {x}, {n})", f=func, x=new_args[0].value,
                        n=cst.Integer(str(VECTOR_LAYERS[lay.kind]))), Info()
        if lay.kind in ("conv", "pool", "groupnorm", "resize", "fn"):
            # (a conv, pool or norm inside the NNX pass's moves to channels-last and back:
            # channel-first here, the moves dropped)
            return cst.Call(expr("jax.vmap({f})", f=func), new_args), replace(x)
        if lay.kind == "bn":
            mapped = expr('jax.vmap({f}, axis_name="batch", in_axes=(0, None), '
                          "out_axes=(0, None))", f=func)
            return self.stateful_call(cst.Call(mapped, new_args)), replace(x)
        if lay.kind == "dropout":
            return _fix_commas(cst.Call(func, [*new_args, _kwarg("key", self.key())])), \
                replace(x)
        if lay.kind == "seq":
            parts = [lay.items.get(str(i)) for i in range(len(lay.items))]
            if not parts or lay.loop or any(p is None or p.kind in ("value", "list", "dict",
                                                                    "seq") for p in parts):
                raise EquinoxError("a Sequential whose layers are not known here")
            if channel_first_seq(lay):
                return cst.Call(expr("jax.vmap({f})", f=func), new_args), replace(x)
            return self.unroll(func, lay, new_args[0].value, x)
        if lay.kind == "module" and lay.cls in self.classes:
            sub = self.classes[lay.cls]
            if not sub.batched:
                raise EquinoxError(f"{lay.cls}, written per example, called from a module "
                                   "kept batched")
            self.callees.append((lay.cls, infos))
            self.analyse(lay.cls, infos)
            call = cst.Call(func, new_args)
            if sub.keyed:
                call = _fix_commas(call.with_changes(args=[*call.args, _kwarg("key",
                                                                              self.key())]))
            if sub.stateful:
                return self.stateful_call(call, _required(sub)), Info()
            return call, Info()
        ranks = einops_ranks(lay.node) if lay.kind in ("lambda", "resize") else None
        if lay.kind == "lambda" and is_identity_lambda(lay.node):  # (nn.Identity's)
            return cst.Call(func, new_args), replace(x)
        if ranks is not None and ranks[0] is not None:
            # an einops layer (its pattern written for one example): over the leading axes
            return expr("over_leading({f}, {x}, {n})", f=func, x=new_args[0].value,
                        n=cst.Integer(str(ranks[0]))), Info()
        raise EquinoxError(f"a {lay.kind} layer in a module kept batched")


def _required(sub: ClassInfo) -> int | None:
    """How many parameters without a default a module's ``__call__`` takes (``state`` comes
    after them: equinox.EquinoxFile.forward)."""
    fn = _init_of(sub.node, "__call__")
    return None if fn is None else sum(1 for p in fn.params.params[1:] if p.default is None)
