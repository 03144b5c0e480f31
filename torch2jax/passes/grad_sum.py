"""Several ``backward()`` calls before one ``optimizer.step()``: torch adds each into ``.grad``
and the parameters do not change between them, so the step applies the gradient of the sum of
the losses, each as it was when its backward ran. These functions rewrite such a region (torch
statements, before the step builder of passes/training.py sees them): the names it assigns
more than once are renamed at all but their last assignment, and the backwards become one
``loss_sum = L1 + L2`` with ``loss_sum.backward()``. Used by the block steps
(passes/rewrite_steps.py) and the loop steps (passes/rewrite_loops.py)."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.passes.common import RenameNames


def summable_backwards(stmts: list) -> bool:
    """The statements (torch's) hold several ``backward()`` calls whose gradients torch
    sums: plain backwards of names, and nothing from the first to the last that reads or
    resets the gradients."""
    at = [i for i, s in enumerate(stmts) if tr._is_method_stmt(s, None, "backward")]
    nested = [s for s in stmts if not isinstance(s, cst.SimpleStatementLine) and findall(
        s, m.Call(func=m.Attribute(attr=m.Name("backward"))))]
    return len(at) > 1 and not nested and all(_plain_backward(stmts[i]) for i in at) and not any(
        _touches_grads(s) for s in stmts[at[0]:at[-1]])


def summed_region(region: list, taken: set[str]) -> tuple[list, list] | None:
    """The region with its backwards summed into one (_single_assignments, then
    _summed_backwards), and that backward; None where the names cannot be renamed."""
    back = [i for i, s in enumerate(region) if tr._is_method_stmt(s, None, "backward")]
    renamed = _single_assignments(region, taken)
    if renamed is None:
        return None
    return _summed_backwards(renamed, [renamed[i] for i in back], taken)


def _plain_backward(stmt: cst.SimpleStatementLine) -> bool:
    """``loss.backward()`` of a name, with no argument but ``retain_graph``."""
    call = stmt.body[0].value
    return isinstance(call.func.value, cst.Name) and all(
        a.keyword is not None and a.keyword.value == "retain_graph" for a in call.args)


def _touches_grads(stmt: cst.CSTNode) -> bool:
    """A statement that reads or changes ``.grad`` (a zero_grad, clipping, ``p.grad``)."""
    return bool(findall(stmt, m.Attribute(attr=m.Name("grad") | m.Name("zero_grad")
                                          | m.Name("clip_grad_norm_")
                                          | m.Name("clip_grad_value_"))
                        | m.Name("clip_grad_norm_") | m.Name("clip_grad_value_")))


def _single_assignments(region: list, taken: set[str]) -> list | None:
    """The region with each name it assigns more than once renamed at all but its last
    assignment (``output`` of the real batch, then of the fake one: ``output_1``, then
    ``output``), so that the step builder may order its statements by what they read; None
    where a statement is not a plain assignment, an expression or a backward() (a name bound
    in a compound statement or by augmented assignment is not renamed)."""
    counts: dict[str, int] = {}
    for st in region:
        reads_only = not isinstance(st, cst.SimpleStatementLine) and not tr.names_of(
            st).assigned  # an `if` that prints
        if not reads_only and (not isinstance(st, cst.SimpleStatementLine) or len(
                st.body) != 1 or not (isinstance(st.body[0], cst.Expr) or m.matches(
                    st.body[0], m.Assign(targets=[m.AssignTarget(target=m.Name() | m.Tuple(
                        elements=[m.ZeroOrMore(m.Element(value=m.Name()))]))])))):
            return None
        for name in tr.names_of(st).assigned:
            counts[name] = counts.get(name, 0) + 1
    current: dict[str, str] = {}
    seen: dict[str, int] = {}
    out = []
    for st in region:
        if not isinstance(st, cst.SimpleStatementLine):
            out.append(st.visit(RenameNames(current)))
            continue
        new = st.with_changes(body=[st.body[0].with_changes(value=st.body[0].value.visit(
            RenameNames(current)))])
        if isinstance(st.body[0], cst.Assign):
            target = st.body[0].targets[0].target
            for name in tr.names_of(target).used:
                seen[name] = seen.get(name, 0) + 1
                if seen[name] < counts[name]:
                    fresh = tr._fresh(f"{name}_{seen[name]}", taken)
                    taken.add(fresh)
                    current[name] = fresh
                else:
                    current.pop(name, None)
            renamed = target.visit(RenameNames({n: current[n] for n in tr.names_of(target).used
                                            if n in current}))
            new = new.with_changes(body=[new.body[0].with_changes(
                targets=[new.body[0].targets[0].with_changes(target=renamed)])])
        out.append(new)
    return out


def _summed_backwards(region: list, back: list, taken: set[str]) -> tuple[list, list]:
    """torch adds each ``L.backward()`` of a region into ``.grad``, and the parameters do not
    change within it: its gradient is that of the sum of the losses, each as it was when its
    backward ran (the region's names are assigned once: _single_assignments). The region with
    the last backward replaced by ``loss_sum = L1 + L2`` and ``loss_sum.backward()``, the
    others dropped, and that statement."""
    name = tr._fresh("loss_sum", taken)
    taken.add(name)
    losses = " + ".join(b.body[0].value.func.value.value for b in back)
    out = []
    last = cst.parse_statement(f"{name}.backward()\n")
    for s in region:
        if s is back[-1]:
            out += [cst.parse_statement(f"{name} = {losses}\n").with_changes(
                leading_lines=s.leading_lines), last]
        elif not any(s is b for b in back):
            out.append(s)
    return out, [last]
