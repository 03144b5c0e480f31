"""Fuse channels-last regions across consecutive statements.

The call pass moves a value to channels-last for each run of convolution/pooling/norm layers
inside one expression and back at its end. When the next statement rebinds the same name and
reads it only through ``jnp.moveaxis(x, 1, -1)``, the move back and the move forward cancel:

    x = jnp.moveaxis(pool(conv1(jnp.moveaxis(x, 1, -1))), -1, 1)
    x = jnp.moveaxis(pool(conv2(jnp.moveaxis(x, 1, -1))), -1, 1)

becomes

    x = pool(conv1(jnp.moveaxis(x, 1, -1)))
    x = jnp.moveaxis(pool(conv2(x)), -1, 1)
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import NoAttributeHooks, findall

# jnp.moveaxis(E, -1, 1): a channels-last value moved back to torch's layout.
FROM_CHANNELS_LAST = m.Call(
    func=m.Attribute(value=m.Name("jnp"), attr=m.Name("moveaxis")),
    args=[m.Arg(), m.Arg(m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1"))),
          m.Arg(m.Integer("1"))],
)


def _to_cl(name: str) -> m.Call:
    return m.Call(
        func=m.Attribute(value=m.Name("jnp"), attr=m.Name("moveaxis")),
        args=[m.Arg(m.Name(name)), m.Arg(m.Integer("1")),
              m.Arg(m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1")))],
    )


def _assign(stmt: cst.BaseStatement) -> cst.Assign | None:
    if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1
            and isinstance(stmt.body[0].targets[0].target, cst.Name)):
        return stmt.body[0]
    return None


class _Replace(cst.CSTTransformer):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def leave_Call(self, original_node, updated_node):
        if m.matches(updated_node, _to_cl(self.name)):
            return cst.Name(self.name)
        return updated_node


def _only_read_channels_last(value: cst.BaseExpression, name: str) -> bool:
    total = len(findall(value, m.Name(name)))
    wrapped = len(findall(value, _to_cl(name)))
    return total > 0 and total == wrapped


class FuseLayoutMoves(NoAttributeHooks, cst.CSTTransformer):
    def leave_IndentedBlock(self, original_node, updated_node):
        body = list(updated_node.body)
        changed = False
        for i in range(len(body) - 1):
            first, second = _assign(body[i]), _assign(body[i + 1])
            if first is None or second is None:
                continue
            name = first.targets[0].target.value
            if (second.targets[0].target.value != name
                    or not m.matches(first.value, FROM_CHANNELS_LAST)
                    or not _only_read_channels_last(second.value, name)):
                continue
            inner = first.value.args[0].value
            body[i] = body[i].with_changes(body=[first.with_changes(value=inner)])
            body[i + 1] = body[i + 1].with_changes(
                body=[second.with_changes(value=second.value.visit(_Replace(name)))])
            changed = True
        return updated_node.with_changes(body=body) if changed else updated_node
