"""Step helpers under linen: ``def train_step(data, target)`` over the script's model and
optimizer (globals), called once per batch from the script's loop. The helper's body is one
train step with no loop of its own; it becomes a jit-compiled step over the TrainState
(defined once, before the helper) and the helper takes and returns the state, as a function
run once per epoch does (targets/linen_training.py ``EpochFunction``); its callers thread the
state and make it, before their outermost loop, from a sample of the batch they pass."""

from __future__ import annotations

from dataclasses import replace

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.targets import linen_training as lt


def step_helpers(epochs: dict[str, lt.EpochFunction]) -> dict[str, set[int]]:
    """The epoch functions whose own block holds the step (``backward()`` then the
    optimizer's ``step()``, no loop around them): name -> the ids of their ``backward()``
    expressions (translated with the block, not marked where they stand)."""
    out: dict[str, set[int]] = {}
    for name, ep in epochs.items():
        fn = ep.fn
        if fn is None or findall(fn.body, m.For() | m.While()):
            continue
        body = list(fn.body.body)
        back = [s for s in body if tr._is_method_stmt(s, None, "backward")]
        steps = [i for i, s in enumerate(body) if tr._is_method_stmt(s, {ep.optimizer}, "step")]
        if len(back) == 1 and len(steps) == 1 and body.index(back[0]) < steps[0]:
            out[name] = {id(back[0].body[0])}
    return out


def helper_names(fn: cst.FunctionDef) -> set[str]:
    """What varies from call to call in a helper: its parameters and the names it binds."""
    return lt.local_names(fn)


def sample_inputs(ep: lt.EpochFunction, call: cst.Call, loop: cst.For,
                  outer: list[cst.For], loop_names: set[str]
                  ) -> tuple[list[cst.BaseStatement], list[cst.BaseExpression]] | None:
    """The sample input of ``model.init`` for a step helper called in ``loop`` (its
    caller's): the helper's statements before its step that bind the model's inputs
    (``data, target = batch``), with the call's arguments for its parameters, after the
    first batch of the caller's loop for the names they read."""
    step = ep.step
    if step is None or ep.body is None:
        return None
    values = ep.bound(call) or {}
    if set(ep.params) - set(values):
        return None  # (a default or a missing argument: not followed)
    at = next((i for i, s in enumerate(ep.body) if s is step.call), None)
    if at is None:
        return None
    pre = [s for s in ep.body[:at] if isinstance(s, cst.SimpleStatementLine)]
    wanted = {n.value for a in step.model_args for n in findall(a, m.Name())}
    kept: list[cst.BaseStatement] = []
    for s in reversed(pre):  # the statements the model's inputs are computed by
        assigned = set(tr.names_of(s).assigned)
        if assigned & wanted:
            kept.insert(0, s)
            wanted = (wanted - assigned) | set(tr.names_of(s).used)
    if wanted - set(ep.params) & lt.local_names(ep.fn):
        return None
    kept = [lt.bind_names(s, values).with_changes(leading_lines=[]) for s in kept]
    inputs = [lt.bind_names(a, values) if not kept else a for a in step.model_args]
    # what the kept statements (or the inputs themselves) read of the caller's batch
    reads = [cst.Name(n) for n in sorted({n.value for s in kept for n in findall(
        s, m.Name())} & loop_names)] if kept else inputs
    probe = replace(step, model_args=reads)
    found = lt.sample_inputs(probe, list(loop.body.body), loop, outer, loop_names)
    if found is None:
        return None
    stmts, firsts = found
    if kept:
        # the first batch's names bound by `found`'s statements (or read as they are)
        binds = [cst.parse_statement(f"{code_of(r)} = {code_of(f)}\n")
                 for r, f in zip(reads, firsts, strict=True) if code_of(r) != code_of(f)]
        return [*stmts, *binds, *kept], inputs
    return stmts, firsts


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)
