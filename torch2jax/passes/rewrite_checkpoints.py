"""Checkpoints: ``torch.save`` / ``torch.load`` of state dicts and checkpoint dicts -> orbax.

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import values as vk
from torch2jax.analysis.accumulate import HOLDS_STATE
from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.analysis.walk import findall
from torch2jax.passes.common import (
    code,
    expr,
)

# the state filter of a model's checkpoint: everything but the RNG state (RngKey, RngCount)
RNG_FREE = "nnx.Not(nnx.RngState)"
# file copies that a checkpoint's path may be given to
_FILE_COPIES = ("shutil.copyfile", "shutil.copy", "shutil.copy2")


class CheckpointsMixin:
    def _checkpoint_call(self, node: cst.Call) -> tuple[str, str, cst.BaseExpression] | None:
        """``torch.save(M.state_dict(), path)`` -> ("save", M, path);
        ``M.load_state_dict(torch.load(path, ...))`` -> ("load", M, path); as statements."""
        parent = self.get_metadata(ParentNodeProvider, node, None)
        q = self.q(node.func)
        if q == "torch.save" and isinstance(parent, cst.Expr) and len(node.args) >= 2 and \
                m.matches(node.args[0].value, m.Call(func=m.Attribute(
                    value=m.Name(), attr=m.Name("state_dict")), args=[])):
            return "save", node.args[0].value.func.value.value, node.args[1].value
        if q == "torch.load" and isinstance(parent, cst.Arg):
            outer = self.get_metadata(ParentNodeProvider, parent, None)
            if (m.matches(outer, m.Call(func=m.Attribute(value=m.Name(),
                                                          attr=m.Name("load_state_dict"))))
                    and len(outer.args) == 1 and node.args and isinstance(
                        self.get_metadata(ParentNodeProvider, outer, None), cst.Expr)):
                return "load", outer.func.value.value, node.args[0].value
        return None

    def _stateful(self, node: cst.BaseExpression) -> bool:
        """A model or an optimizer (its state is an nnx.state)."""
        if not isinstance(node, cst.Name):
            return False
        t = self.training
        if node.value in t.model_vars or node.value in t.optimizer_names or (
                node.value in self._acc.foreign):
            return True
        return self.values is not None and self.values.kind(node) in (
            vk.Kind.MODULE, vk.Kind.OPTIMIZER)

    def _holds_optimizer(self, node: cst.BaseExpression) -> bool:
        return isinstance(node, cst.Name) and self.values is not None and (
            self.values.kind(node) == vk.Kind.OPTIMIZER)

    def _saved_state(self, owner: cst.BaseExpression) -> str:
        """What a converted ``state_dict`` / ``load_state_dict`` covers: a model's params and
        buffers, as torch's do, not its RNG state (``nnx.Rngs`` and each Dropout's key and
        count), which stays the one the program's seed made; an optimizer's whole state."""
        name = code(owner)
        if name in self.training.optimizer_names or self._holds_optimizer(owner):
            return f"nnx.state({name})"
        return f"nnx.state({name}, {RNG_FREE})"

    def _ckpt_entries(self) -> str:
        """What a state_dict in a checkpoint dict is written as (the equinox pass's form on
        its NNX intermediate: targets/equinox_checkpoints.py)."""
        if self.target.intermediate:
            return "a model's arrays and an optimizer state's leaves, as lists"
        return "nnx.state pure dicts"

    def _saved_state_dict(self, node: cst.Call) -> bool:
        """``state_dict()`` in a form the checkpoint translations take: saved by
        ``torch.save`` (its argument, or a value of a dict literal)."""
        parent = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(parent, cst.DictElement):
            return True
        outer = self.get_metadata(ParentNodeProvider, parent, None) if isinstance(
            parent, cst.Arg) else None
        return isinstance(outer, cst.Call) and self.q(outer.func) == "torch.save"

    def _checkpoint_dict_call(self, original_node: cst.Call):
        """Checkpoint dicts (analysis/accumulate.py find_checkpoint_dicts), nnx:
        ``m.state_dict()`` in the dict -> its nnx.state as a pure dict; ``torch.load(path)``
        -> the orbax PyTree restored."""
        func = original_node.func
        if self.q(func) in _FILE_COPIES:
            return self._checkpoint_copy(original_node)
        if self.target.train_state and id(original_node) in getattr(
                self, "_memory_states", ()) and m.matches(func, m.Attribute(value=m.Name())) and (
                func.value.value in self._model_names()) and not self._lt_trains_none():
            # linen, best = copy.deepcopy(model.state_dict()): the TrainState's variables
            return self._lt_variables_now()
        if id(original_node) in getattr(self, "_memory_states", ()) and self._stateful(
                func.value) and not self.target.train_state:  # best = copy.deepcopy(model.
            # state_dict()): kept in memory
            self.need("nnx")
            return expr(f"{self._saved_state(func.value)}.to_pure_dict()")
        if self.target.train_state and m.matches(func, m.Attribute(
                value=m.Name(), attr=m.Name("state_dict"))) and not original_node.args and (
                func.value.value in self.training.model_vars) and not self._saved_state_dict(
                original_node):  # linen: best = copy.deepcopy(model.state_dict())
            self.diag(original_node, "state_dict", "error",
                      f"{code(func.value)}.state_dict() read as a dict: linen keeps the "
                      "variables in the TrainState (state.params), not in the module")
            return None
        if not self.target.stateful_modules:
            return None
        if m.matches(func, m.Attribute(attr=m.Name("state_dict"))) and not original_node.args \
                and self._stateful(func.value) and not self._saved_state_dict(original_node) \
                and not self.target.intermediate:
            self.diag(original_node, "state_dict", "error",
                      f"{code(func.value)}.state_dict() read as a dict: torch's is flat, by "
                      f"dotted keys; the converted model's state is nnx.state({code(func.value)})"
                      ", nested by attribute (its .to_pure_dict() for a plain dict)")
            return None
        if not (self._ckpt_dicts or self._ckpt_loads or self._ckpt_inline):
            return None
        if m.matches(func, m.Attribute(attr=m.Name("state_dict"))) and not original_node.args \
                and self._stateful(func.value) and isinstance(self.get_metadata(
                    ParentNodeProvider, original_node, None), cst.DictElement):
            self.need("nnx")
            return expr(f"{self._saved_state(func.value)}.to_pure_dict()")
        if self.q(func) == "torch.load" and original_node.args and m.matches(
                self.get_metadata(ParentNodeProvider, original_node, None),
                m.Assign(targets=[m.AssignTarget(target=m.Name())])):
            target = self.get_metadata(ParentNodeProvider, original_node, None).targets[0]
            if target.target.value not in self._ckpt_loads:
                return None
            self.need("os", "ocp")
            self.diag(original_node, "torch.load", "info",
                      "torch.load of a checkpoint dict -> the orbax PyTree checkpoint (a "
                      "directory at that path) that the converted torch.save writes; "
                      f"state_dicts in it are {self._ckpt_entries()}")
            return expr(f"ocp.PyTreeCheckpointer().restore(os.path.abspath("
                        f"{code(original_node.args[0].value)}))")
        return None

    def _checkpoint_copy(self, node: cst.Call) -> cst.BaseExpression | None:
        """``shutil.copyfile(filename, 'model_best.pth.tar')`` of the path a checkpoint dict
        was saved to in the same function: orbax wrote a directory there, which copyfile
        cannot copy: ``shutil.copytree(..., dirs_exist_ok=True)``."""
        if not self._fn_stack or len(node.args) < 2 or any(
                a.keyword or a.star for a in node.args[:2]):
            return None
        paths = {code(c.args[1].value) for c in findall(self._fn_stack[-1], m.Call(
            func=m.Attribute(value=m.Name("torch"), attr=m.Name("save")),
            args=[m.Arg(keyword=None), m.Arg(keyword=None), m.ZeroOrMore()]))
            if m.matches(c.args[0].value, HOLDS_STATE) or (isinstance(
                c.args[0].value, cst.Name) and c.args[0].value.value in self._ckpt_dicts)}
        if code(node.args[0].value) not in paths:
            return None
        self.diag(node, "torch.save", "info", "a copy of the saved checkpoint: orbax's is a "
                  "directory, copied with shutil.copytree")
        return expr("shutil.copytree({a}, {b}, dirs_exist_ok=True)", a=node.args[0].value,
                    b=node.args[1].value)

    def _checkpoint_dict_statement(self, original_node: cst.Expr,
                                   updated_node: cst.Expr | None = None):
        value = original_node.value
        if self.target.train_state:
            return self._lt_checkpoint_dict_save(original_node)
        if not self.target.stateful_modules or not isinstance(value, cst.Call):
            return None
        if self.q(value.func) == "torch.save" and len(value.args) >= 2 and isinstance(
                value.args[0].value, cst.Dict) and self._ckpt_inline and isinstance(
                updated_node, cst.Expr) and isinstance(updated_node.value, cst.Call) and \
                len(updated_node.value.args) >= 2 and not value.args[0].keyword and any(
                m.matches(e, m.DictElement(value=m.Call(func=m.Attribute(
                    attr=m.Name("state_dict")), args=[]))) for e in value.args[0].value.elements):
            # torch.save({'model': model.state_dict(), 'config': config}, path): the dict
            # (its state_dicts nnx.state pure dicts) as an orbax PyTree checkpoint
            self.need("os", "ocp")
            self.diag(original_node, "torch.save", "info",
                      "torch.save of a checkpoint dict -> an orbax PyTree checkpoint (a "
                      f"directory at that path); its state_dicts are {self._ckpt_entries()}")
            args = updated_node.value.args
            return cst.Expr(expr(
                f"ocp.PyTreeCheckpointer().save(os.path.abspath({code(args[1].value)}), "
                "{d}, force=True)", d=args[0].value))
        if self.q(value.func) == "torch.save" and len(value.args) >= 2 and isinstance(
                value.args[0].value, cst.Name) and value.args[0].value.value in self._ckpt_dicts:
            self.need("os", "ocp")
            self.diag(original_node, "torch.save", "info",
                      "torch.save of a checkpoint dict -> an orbax PyTree checkpoint (a "
                      f"directory at that path); its state_dicts are {self._ckpt_entries()}")
            return cst.Expr(expr(
                f"ocp.PyTreeCheckpointer().save(os.path.abspath({code(value.args[1].value)}), "
                f"{value.args[0].value.value}, force=True)"))
        if m.matches(value, m.Call(func=m.Attribute(value=m.Name(),
                                                    attr=m.Name("load_state_dict")),
                                   args=[m.Arg(keyword=None)])) and not m.matches(
                value.args[0].value, m.Call()) and self._stateful(value.func.value) and (
                self._ckpt_loads or code(value.args[0].value) in getattr(
                    self, "_memory_state_names", ())):
            owner = value.func.value.value
            state = f"{owner}_state"
            self.need("nnx")
            self._pending[-1].after.extend(cst.parse_statement(line) for line in (
                f"{state}.replace_by_pure_dict({code(value.args[0].value)})\n",
                f"nnx.update({owner}, {state})\n"))
            self.diag(original_node, "load_state_dict", "info", (
                      f"{owner}.load_state_dict(d) -> the checkpoint's arrays put back into "
                      f"{owner}'s structure") if self.target.intermediate else
                      f"{owner}.load_state_dict(d) -> its nnx.state (a model's without its RNG "
                      "state, which torch's state_dict does not hold either) with the "
                      "checkpoint's pure dict put in, then nnx.update")
            return cst.Assign(targets=[cst.AssignTarget(cst.Name(state))],
                              value=expr(self._saved_state(value.func.value)))
        return None

    def _checkpoint_statement(self, original_node: cst.Expr,
                              updated_node: cst.Expr | None = None):
        value = original_node.value
        if not (self.target.stateful_modules or self.target.train_state):
            return None
        handled = self._checkpoint_dict_statement(original_node, updated_node)
        if handled is not None:
            return handled
        site = None
        if self.q(value.func) == "torch.save":
            site = self._checkpoint_call(value)
        elif m.matches(value, m.Call(func=m.Attribute(attr=m.Name("load_state_dict")),
                                     args=[m.Arg(m.Call())])):
            site = self._checkpoint_call(value.args[0].value)
        if site is None:
            return None
        kind, model, path = site
        p = code(path)
        if self.target.train_state:
            return self._lt_checkpoint(original_node, kind, model, p)
        if kind == "save":  # the whole state: the layout `torch2jax weights` writes too
            inner = f"checkpointer.save(os.path.abspath({p}), nnx.state({model}), force=True)"
        else:  # orbax restores the whole tree; what goes into the model: not the RNG state
            # (the equinox pass writes eqx.combine of the model's arrays: no RNG state)
            keep = "" if model in self.training.optimizer_names or self.target.intermediate \
                else f".filter({RNG_FREE})"
            inner = (f"nnx.update({model}, checkpointer.restore(os.path.abspath({p}), "
                     f"nnx.state({model})){keep})")
        self.need("nnx")
        # (the equinox pass writes the model's arrays, eqx.filter(model, eqx.is_array))
        what = "the model's arrays" if self.target.intermediate else "the model's nnx.state"
        return self._orbax(original_node, kind, inner, what)

    def _orbax(self, original_node, kind: str, inner: str, what: str):
        """The statement becomes ``with ocp.StandardCheckpointer() as checkpointer: inner``."""
        block = cst.parse_statement(f"with ocp.StandardCheckpointer() as checkpointer:\n"
                                    f"    {inner}\n")
        self.need("os", "ocp")
        self.diag(original_node, f"torch.{kind}", "info",
                  f"{'saves' if kind == 'save' else 'restores'} an orbax checkpoint (a "
                  f"directory at that path) of {what}")
        self._pending[-1].after.append(block)
        return cst.RemoveFromParent()
