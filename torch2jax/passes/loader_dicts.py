"""A dict of loaders keyed by phase, one of them shuffled: a dict of functions of the epoch.

PyTorch's transfer-learning tutorial keeps its loaders in a dict and iterates the phase's:

    dataloaders = {x: DataLoader(image_datasets[x], batch_size=4, shuffle=True)
                   for x in ["train", "val"]}
    ...
    for inputs, labels in dataloaders[phase]:

(or ``{"train": train_loader, "val": val_loader}`` of loaders built by name). torch's shuffled
loader draws a new order at every epoch, which a grain pipeline takes from a seed per epoch:
a shuffled loader assigned to a name becomes a function of the epoch (passes/rewrite_data.py),
so the dict holds functions of the epoch, every one of them:

* the comprehension's DataLoader is ``lambda epoch, x=x: <pipeline>`` (the loop variable
  bound when the item is made, as torch's loader was built with it);
* in a dict literal, a loader that does not shuffle is ``lambda epoch: val_loader``;
* ``for b in dataloaders[phase]`` iterates ``dataloaders[phase](epoch)`` (the epoch of the
  loop around it, as for a named loader), and any other read of an item
  (``len(dataloaders["train"])``) reads the epoch-0 pipeline, whose length and dataset are
  every epoch's.

Only for a dict assigned once, at the top level of the module, whose every other read is a
subscript; otherwise nothing is rewritten and the loaders stay marked (a shuffled loader in a
container) or, built by name, the dict is reported (passes/rewrite_data.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall


@dataclass
class LoaderDicts:
    names: set[str] = field(default_factory=set)  # the dicts of epoch functions
    wrapped: set[int] = field(default_factory=set)  # ids of loader names made functions
    # ids of the comprehensions' DataLoader calls -> the names their lambda binds
    comp_calls: dict[int, list[str]] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)  # id of an assignment -> why


def find(module: cst.Module, loader_call: Callable[[cst.Call], bool],
         shuffled_call: Callable[[cst.Call], bool], loaders: dict) -> LoaderDicts:
    """``loader_call``: a DataLoader call; ``shuffled_call``: one that shuffles; ``loaders``:
    the loaders assigned to names (their ``shuffled`` flags)."""
    out = LoaderDicts()
    for stmt in module.body:
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(
                targets=[m.AssignTarget(target=m.Name())])])):
            continue
        assign = stmt.body[0]
        name, value = assign.targets[0].target.value, assign.value
        found = _literal(value, loaders) if isinstance(value, cst.Dict) else (
            _comprehension(value, loader_call, shuffled_call)
            if isinstance(value, cst.DictComp) else None)
        if found is None:
            continue
        bound = [t for t in findall(module, m.AssignTarget(target=m.Name(name)))]
        reads = [n for n in findall(module, m.Name(name))
                 if n is not assign.targets[0].target]
        items = findall(module, m.Subscript(value=m.Name(name)))
        if len(bound) != 1 or len(reads) != len(items):
            out.refused[id(assign)] = (
                f"{name} holds loaders shuffled per epoch (functions of the epoch) and is "
                "assigned more than once or read other than by key")
            continue
        out.names.add(name)
        wrapped, comp = found
        out.wrapped |= wrapped
        out.comp_calls.update(comp)
    return out


def _literal(value: cst.Dict, loaders: dict) -> tuple[set[int], dict] | None:
    names = [e.value for e in value.elements if isinstance(e, cst.DictElement)]
    if len(names) != len(value.elements) or not names or not all(
            isinstance(n, cst.Name) and n.value in loaders for n in names):
        return None
    if not any(loaders[n.value].shuffled for n in names):
        return None
    return {id(n) for n in names if not loaders[n.value].shuffled}, {}


def _comprehension(value: cst.DictComp, loader_call, shuffled_call
                   ) -> tuple[set[int], dict] | None:
    call = value.value
    if not (isinstance(call, cst.Call) and loader_call(call) and shuffled_call(call)) or (
            value.for_in.inner_for_in is not None):
        return None
    targets = [n.value for n in findall(value.for_in.target, m.Name())]
    return set(), {id(call): targets}


def epoch_lambda(pipeline: cst.BaseExpression, bound: list[str]) -> cst.Lambda:
    """``lambda epoch, x=x: pipeline``."""
    params = [cst.Param(cst.Name("epoch"))] + [
        cst.Param(cst.Name(b), default=cst.Name(b), equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""),
            whitespace_after=cst.SimpleWhitespace(""))) for b in bound]
    return cst.Lambda(cst.Parameters(params), pipeline)


def wrapped_loader(name: cst.Name) -> cst.Lambda:
    """``lambda epoch: val_loader``: a loader that does not shuffle, in a dict of epoch
    functions."""
    return cst.Lambda(cst.Parameters([cst.Param(cst.Name("epoch"))]), name)


def item_read(item: cst.Subscript, epoch: str) -> cst.Call:
    """``dataloaders[phase]`` -> ``dataloaders[phase](epoch)``."""
    return cst.Call(item, [cst.Arg(cst.Name(epoch) if epoch.isidentifier()
                                   else cst.parse_expression(epoch))])
