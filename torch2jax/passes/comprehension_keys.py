"""Random draws inside a comprehension: one key per element, folded from one split key.

``{x: make_data(n) for x in ["train", "val"]}`` draws (``make_data`` draws its examples, so it
takes a key once converted), and each element needs a key of its own. A comprehension has no
statement to split keys in, so the statement around it splits one key, as for any draw, and
each element's key is ``jax.random.fold_in(subkey, i)`` of the element's index, the
comprehension iterating ``enumerate(...)`` of its iterable:

    key, subkey = jax.random.split(key)
    image_datasets = {x: make_data(n, key=jax.random.fold_in(subkey, i))
                      for i, x in enumerate(["train", "val"])}

Only for a comprehension with one ``for`` (nested ``for`` clauses are still marked), and not
inside a lambda (which has no statement of its own around its draws). The keys differ from
torch's draws (JAX's generator is not torch's), as every converted draw does.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall


@dataclass
class Frame:
    """A comprehension being rewritten; ``index``: the name of the element's index."""

    index: str
    used: bool = False


def frame_for(node: cst.BaseComp, taken: set[str]) -> Frame | None:
    """A frame for ``node`` where its draws can be folded per element; None otherwise."""
    if node.for_in.inner_for_in is not None or node.for_in.asynchronous is not None:
        return None
    names = {n.value for n in findall(node, m.Name())} | taken
    index, k = "i", 2
    while index in names:
        index, k = f"i{k}", k + 1
    return Frame(index)


def folded(base: cst.BaseExpression, frame: Frame) -> cst.BaseExpression:
    frame.used = True
    return cst.parse_expression(
        f"jax.random.fold_in({cst.Module([]).code_for_node(base)}, {frame.index})")


def enumerated(node: cst.BaseComp, frame: Frame) -> cst.BaseComp:
    """``node`` iterating ``enumerate(...)`` with the frame's index, where a draw used it."""
    if not frame.used:
        return node
    comp = node.for_in
    inner = comp.target
    if isinstance(inner, cst.Tuple) and not inner.lpar:  # for i, (k, v) in enumerate(...)
        inner = inner.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    target = cst.Tuple([cst.Element(cst.Name(frame.index)), cst.Element(inner)],
                       lpar=[], rpar=[])
    it = cst.Call(cst.Name("enumerate"), [cst.Arg(comp.iter)])
    return node.with_changes(for_in=comp.with_changes(target=target, iter=it))
