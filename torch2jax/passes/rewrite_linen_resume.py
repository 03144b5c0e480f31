"""A checkpoint dict resumed under linen (``--target linen``): pytorch-cifar's ``checkpoint =
torch.load(path); net.load_state_dict(checkpoint['net']); best_acc = checkpoint['acc']``
under ``if args.resume:``, before the model is trained.

linen keeps the variables and the optimizer state in the TrainState, which the training
translation makes later (before the epoch loop, from the loader's first batch). The load reads
the checkpoint into a name that is None unless the resume ran (``resumed_variables = None``
before the statement that holds it), and once the TrainState exists its parameters (and
BatchNorm statistics, optimizer state) are replaced by the restored ones where that name is
set. The checkpoint is the orbax PyTree the converted ``torch.save`` writes (rewrite_linen.py:
a model's state_dict is its linen variables, an optimizer's the TrainState's optimizer state
as flax's state dict, ``serialization.to_state_dict``).

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis.walk import findall
from torch2jax.passes import training as tr
from torch2jax.targets import linen_training as lt

_LOAD = m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("load_state_dict")),
               args=[m.Arg(value=m.Subscript(value=m.Name(), slice=[m.SubscriptElement(
                   slice=m.Index(value=m.SimpleString()))]), keyword=None)])


class LinenResumeMixin:
    def _lt_resume_site(self, node: cst.CSTNode) -> bool:
        """``node`` is at the file's top level (in no function, class or loop) and before
        the first top-level statement that trains (a backward(), or a call of a function
        that does), where the TrainState is made."""
        if self._fn_stack or self._class_stack or self._for_stack or self._while_stack:
            return False
        trains = m.Call(func=m.Attribute(attr=m.Name("backward"))) | m.Call(func=m.Name(
            m.MatchIfTrue(lambda n: n in self._lt_epoch or n in self._lt_trainers)))
        here = self._pending[0] if self._pending else None
        for s in self._root.body:
            if findall(s, trains):
                return False
            if findall(s, m.MatchIfTrue(lambda n: n is node)):
                return here is not None
        return False

    def _lt_resume_loads(self, name: str) -> bool:
        """Every ``load_state_dict`` of the checkpoint ``name`` restores the model or the
        optimizer at a resume site, and nothing else reads the loaded dict but by key."""
        loads = [c for c in findall(self._root, _LOAD)
                 if c.args[0].value.value.value == name]
        return bool(loads) and all(
            c.func.value.value in self._model_names()
            or c.func.value.value in self.training.optimizer_names for c in loads)

    def _lt_resume(self, original_node: cst.Expr) -> cst.BaseSmallStatement | None:
        """``net.load_state_dict(checkpoint["net"])`` / ``optimizer.load_state_dict(
        checkpoint["optimizer"])`` of a resume: ``resumed_variables = checkpoint["net"]``,
        put into the TrainState once it exists."""
        value = original_node.value
        if self._lt_trains_none() or not m.matches(value, _LOAD):
            return None
        owner, source = value.func.value.value, value.args[0].value
        if source.value.value not in self._ckpt_loads or not self._lt_resume_site(
                original_node):
            return None
        model = owner in self._model_names()
        if not model and owner not in self.training.optimizer_names:
            return None
        taken = self._file_names | set(getattr(self, "_lt_resumed", {}).values())
        if not hasattr(self, "_lt_resumed"):
            self._lt_resumed: dict[str, str] = {}
        kind = "variables" if model else "opt_state"
        name = self._lt_resumed.get(kind) or tr._fresh(f"resumed_{kind}", taken)
        if kind not in self._lt_resumed:
            self._lt_resumed[kind] = name
            self._pending[0].before.append(cst.parse_statement(f"{name} = None\n"))
            if model:
                bs = f', batch_stats={name}["batch_stats"]' if self._lt_batch_stats else ""
                put = f'{lt.STATE}.replace(params={name}["params"]{bs})'
            else:
                self.need("serialization")
                put = (f"{lt.STATE}.replace(\n        opt_state=serialization.from_state_dict("
                       f"{lt.STATE}.opt_state, {name}))")
            self._lt_after_state.append(cst.parse_statement(
                f"if {name} is not None:  # {owner}.load_state_dict of the resume\n"
                f"    {lt.STATE} = {put}\n"))
        self.diag(original_node, "load_state_dict", "info",
                  f"{owner}.load_state_dict(d) before training -> {name} = d, put into the "
                  f"TrainState ({'its params' if model else 'its opt_state'}) once the "
                  "TrainState is made")
        return cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=source)
