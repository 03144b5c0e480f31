"""The torch side of ``verify --program``: run the user's torch program unchanged, observed.

``python -m torch2jax.verify.program_torch RESULT STEPS PROGRAM [ARGS...]`` installs the
instrumentation, then runs PROGRAM as ``__main__``. At the first optimizer's construction it
finds the model (the innermost module holding every parameter of the optimizer), keeps its
initial ``state_dict``, turns its Dropout modules off and records the inputs of each of its
forward calls; every batch a ``DataLoader`` yields is recorded too (labels that never reach
the model included), and the integer seeds the program's own code passes to ``torch.manual_seed``
and its kin. Every optimizer step records each group's learning rate (global step hooks, so
that an optimizer's own ``step`` is covered), every scalar ``backward()`` the loss and the
step it belongs to. After each step it takes the parameters, the optimizer state and a
weight-decay probe; after STEPS steps it stops the program. The record is pickled to RESULT (numpy arrays only: the JAX side reads it without
torch).
"""

from __future__ import annotations

import gc
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any

from torch2jax.verify.program_common import (
    PROGRAM_DRAW_ELEMENTS,
    ProgramStopped,
    SeedLog,
    batch_leaves,
    in_constructor,
    randint_kind,
    run_program,
    wrap_iter,
)


def _np(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy().copy()
    if isinstance(value, (list, tuple)):
        return type(value)(_np(v) for v in value)
    if isinstance(value, dict):
        return {k: _np(v) for k, v in value.items()}
    return value


def _float(value: Any) -> float:
    return float(value.detach()) if hasattr(value, "detach") else float(value)


class TorchRecorder:
    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.record: dict[str, Any] = {"losses": [], "loss_steps": [], "lrs": [],
                                       "forwards": [], "batches": [], "notes": [], "steps": 0,
                                       "trace": [], "draws": [], "program_draws": []}
        self.program_elements = 0
        self.optimizer: Any = None
        self.model: Any = None
        self.names: dict[int, str] = {}
        self.busy = False
        self.drawing = False  # inside the model's forward: its random draws are recorded

    # --- the model ------------------------------------------------------------------------
    def _find_model(self, optimizer: Any) -> Any:
        import torch

        wanted = {id(p) for g in optimizer.param_groups for p in g["params"]}
        with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
            warnings.simplefilter("ignore")
            modules = [m for m in gc.get_objects() if isinstance(m, torch.nn.Module)]
        found = [m for m in modules if wanted <= {id(p) for p in m.parameters()}]
        # the outermost (a container inside a model with tied weights can hold all of them:
        # nanoGPT's `transformer` ModuleDict), then through wrappers (DDP's `module`,
        # torch.compile's `_orig_mod`) to the model they wrap
        outer = [m for m in found if not any(o is not m and m in set(o.modules()) for o in found)]
        model = outer[0] if len(outer) == 1 else None
        if not found:  # one optimizer over several models' parameters: the first one's model
            model = self._first_of_several(optimizer, modules)
        while model is not None:
            inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
            if not any(inner is m for m in found):
                break
            model = inner
        return model

    def _first_of_several(self, optimizer: Any, modules: list[Any]) -> Any:
        """Where the optimizer holds the parameters of several models (``list(a.parameters())
        + list(b.parameters())``), each held whole: the outermost module holding its first
        parameter (the others are fed as other models; their steps show in the losses)."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        holding = [m for m in modules if any(p is params[0] for p in m.parameters())]
        outer = [m for m in holding
                 if not any(o is not m and m in set(o.modules()) for o in modules)]
        if len(outer) != 1:
            return None
        mine = {id(p) for p in outer[0].parameters()}
        rest = {id(p) for p in params} - mine
        whole = [m for m in modules if {id(p) for p in m.parameters()} <= rest]
        if not rest or {id(p) for m in whole for p in m.parameters()} != rest:
            return None
        self.record["notes"].append(
            "the optimizer holds several models' parameters: the first model's are compared "
            "step by step, the others' through the losses")
        return outer[0]

    def _other_models(self, model: Any, table: Any) -> dict[str, dict[str, Any]]:
        """The other models alive when the optimizer is made (a frozen teacher, a second
        network), by class name, where their class is the only one of its name: their
        initial weights, for the converted program's models of those classes."""
        import torch

        from torch2jax.weights import rule_for_module

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            modules = [m for m in gc.get_objects() if isinstance(m, torch.nn.Module)]
        inside = {id(x) for m in modules for x in m.modules() if x is not m}
        outer = [m for m in modules if id(m) not in inside and m is not model
                 and any(True for _ in m.parameters())]
        names = [type(m).__name__ for m in outer]
        others = {}
        for m in outer:
            name = type(m).__name__
            if names.count(name) != 1 or name == type(model).__name__:
                continue  # two of a class (or the trained model's): which is which is unknown
            others[name] = {
                "init": {k: _np(v) for k, v in m.state_dict().items()},
                "layer_rules": {prefix: rule.torch for prefix, mod in m.named_modules()
                                if (rule := rule_for_module(mod, table)) is not None}}
        return others

    def on_optimizer(self, optimizer: Any) -> None:
        from torch2jax.verify.common import is_torch_dropout, switch_off_dropout

        if self.busy or self.optimizer is not None:
            return
        self.optimizer = optimizer
        model = self.model = self._find_model(optimizer)
        if model is None:
            self.record["notes"].append("no module holds every parameter of the optimizer: "
                                        "initial weights and batches are not shared")
            return
        state = model.state_dict(keep_vars=True)
        by_storage: dict[int, str] = {}
        ties = {}
        for key, tensor in state.items():
            if tensor.is_floating_point() and tensor.numel():
                first = by_storage.setdefault(tensor.data_ptr(), key)
                if first != key:
                    ties[key] = first
        self.record["init"] = {k: _np(v) for k, v in state.items()}
        self.record["ties"] = ties
        self.record["model_class"] = type(model).__name__
        from torch2jax.weights import builtin_rules, layer_rules_by_class, rule_for_module

        table = layer_rules_by_class(builtin_rules())
        # the layer rule of each torch layer by its path: where the converted layer is a
        # helper class of the file (TorchLSTM), its rule says where torch's names go
        self.record["layer_rules"] = {
            prefix: rule.torch for prefix, mod in model.named_modules()
            if (rule := rule_for_module(mod, table)) is not None}
        self.record["others"] = self._other_models(model, table)
        self.names = {id(p): n for n, p in model.named_parameters()}
        dropouts = [m for m in model.modules() if is_torch_dropout(m)]
        for m in dropouts:
            switch_off_dropout(m)
        if dropouts:
            self.record["notes"].append(f"torch: {len(dropouts)} Dropout modules set to p=0")
        model.register_forward_pre_hook(self.on_forward, with_kwargs=True)
        model.register_forward_hook(self.after_forward)

    def on_forward(self, module: Any, args: tuple, kwargs: dict) -> None:
        if not self.busy:
            # the lines printed before the model's last call (what the comparison of printed
            # lines may leave out at the stop: verify/program.py's _compare_prints)
            self.record["forward_line"] = getattr(sys.stdout, "lines", None)
            self.record["forwards"].append((_np(tuple(args)), _np(dict(kwargs))))
            self.record["draws"].append([])
            self.drawing = True

    def after_forward(self, module: Any, args: tuple, output: Any) -> None:
        self.drawing = False

    def on_draw(self, kind: str | None, value: Any) -> None:
        """A draw from torch's random functions inside the model's forward (a VAE's
        ``torch.randn_like``): its values, which the JAX side's k-th forward replays in order.
        ``kind`` None: a draw the JAX side cannot be given (``torch.normal(mean, std)``): the
        call's draws are not replayed. A draw elsewhere in the program (its data, another
        model's forward), outside a module's constructor, is a program draw: the JAX side's
        draws outside the model's forward replay them in order."""
        if self.busy:
            return
        if self.drawing:
            if self.record["draws"]:
                self.record["draws"][-1].append((kind, _np(value)))
            return
        import torch

        if self.program_elements > PROGRAM_DRAW_ELEMENTS or in_constructor(torch.nn.Module):
            return
        self.program_elements += value.numel()
        if self.program_elements > PROGRAM_DRAW_ELEMENTS:
            self.record["notes"].append("the program's draws outside the model's forward pass "
                                        f"recorded up to {PROGRAM_DRAW_ELEMENTS} elements")
            kind = None  # (the JAX side stops replaying there)
        self.record["program_draws"].append((kind, _np(value) if kind else None))

    def on_batch(self, batch: Any) -> Any:
        if not self.busy:
            self.record["batches"].append(
                [_np(v) if hasattr(v, "detach") else None for v in batch_leaves(batch)])
        return batch

    # --- steps ----------------------------------------------------------------------------
    def pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.busy and optimizer is self.optimizer:
            self.record["lrs"].append([_float(g["lr"]) for g in optimizer.param_groups])

    def post_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.busy or optimizer is not self.optimizer:
            return
        self.record["steps"] += 1
        self.snapshot()
        if self.record["steps"] >= self.steps:
            raise ProgramStopped

    def on_backward(self, tensor: Any) -> None:
        if not self.busy and tensor.numel() == 1:
            self.record["losses"].append(_float(tensor))
            self.record["loss_steps"].append(self.record["steps"] + 1)

    def snapshot(self) -> None:
        opt = self.optimizer
        if self.model is None:
            return
        params = {n: _np(p) for n, p in self.model.named_parameters()}
        opt_state = {
            self.names[id(p)]: {k: _np(v) for k, v in opt.state[p].items()
                                if hasattr(v, "dim") and v.dim() > 0}
            for g in opt.param_groups for p in g["params"] if id(p) in self.names}
        self.record["trace"].append({"params": params, "opt_state": opt_state,
                                     "decay": self.decay_probe()})
        self.record.update(self.record["trace"][-1])  # the last step's, at the top

    def decay_probe(self) -> dict[str, tuple[bool, float]]:
        """Which tensors weight decay touches, and by how much: one step of a fresh optimizer
        of the same class and groups on copies of the parameters with zero gradients (only
        decay moves a parameter then). Per tensor: ``(moved, -<delta, p> / (lr <p, p>))``,
        AdamW's ``weight_decay`` itself."""
        import torch

        opt, out = self.optimizer, {}
        groups, pairs = [], []
        for g in opt.param_groups:
            copies = []
            for p in g["params"]:
                c = p.detach().double().clone().requires_grad_(True)  # decay, not rounding
                c.grad = torch.zeros_like(c)
                copies.append(c)
                pairs.append((p, c, _float(g["lr"])))
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": copies})
        self.busy = True
        try:
            fresh = type(opt)(groups)
            fresh.step()
        finally:
            self.busy = False
        for p, c, lr in pairs:
            if id(p) not in self.names:
                continue
            before = p.detach().double()
            delta = c.detach() - before
            norm = float((before * before).sum())
            decay = -float((delta * before).sum()) / (lr * norm) if lr and norm else 0.0
            out[self.names[id(p)]] = (bool((delta != 0).any()), decay)
        return out


def install(recorder: TorchRecorder) -> None:
    import torch
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    original_init = torch.optim.Optimizer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        recorder.on_optimizer(self)

    torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign]
    register_optimizer_step_pre_hook(recorder.pre_step)
    register_optimizer_step_post_hook(recorder.post_step)
    original_backward = torch.Tensor.backward

    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        recorder.on_backward(self)
        return original_backward(self, *args, **kwargs)

    torch.Tensor.backward = backward  # type: ignore[method-assign]
    wrap_iter(torch.utils.data.DataLoader, recorder.on_batch, [False])
    install_draws(recorder)


# torch's random functions -> the kind of JAX draw that replays them (program_jax.DRAWS);
# None: recorded so that the forward's draws are known not to be replayable
TORCH_DRAWS = {"randn": "normal", "randn_like": "normal", "rand": "uniform",
               "rand_like": "uniform", "randint": "randint", "randint_like": "randint",
               "bernoulli": "bernoulli", "normal": None, "multinomial": None, "randperm": None,
               "poisson": None}


def _randint_kind(name: str, args: tuple, kwargs: dict) -> str:
    """``torch.randint(high, size)``, ``randint(low, high, size)``, ``randint_like(x, high)``,
    ``randint_like(x, low, high)``, their bounds by keyword too: the kind with its bounds."""
    bounds = list(args[1:] if name == "randint_like" else args)
    while bounds and not isinstance(bounds[-1], (int, float)) and not (
            hasattr(bounds[-1], "dim") and bounds[-1].dim() == 0):
        bounds.pop()  # (the size)
    low, high = kwargs.get("low"), kwargs.get("high")
    if high is None and bounds:
        high = bounds.pop()
    if low is None:
        low = bounds.pop() if bounds else 0
    return randint_kind(low, high)


def install_draws(recorder: TorchRecorder) -> None:
    """Each of torch's random functions records what it returns inside the model's forward."""
    import torch

    def patched(original: Any, kind: str | None) -> Any:
        def draw(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            recorder.on_draw(_randint_kind(original.__name__, args, kwargs)
                             if kind == "randint" else kind, out)
            return out

        return draw

    for name, kind in TORCH_DRAWS.items():
        original = getattr(torch, name, None)
        if original is not None:
            setattr(torch, name, patched(original, kind))


def install_seeds(recorder: TorchRecorder, program: str) -> SeedLog:
    import torch

    log = SeedLog(Path(program).parent, lambda: recorder.record["steps"] + 1)
    log.patch_common()
    log.patch(torch, "manual_seed", "torch.manual_seed")
    log.patch(torch.random, "manual_seed", "torch.manual_seed")
    log.patch(torch.cuda, "manual_seed", "torch.cuda.manual_seed")
    log.patch(torch.cuda, "manual_seed_all", "torch.cuda.manual_seed_all")

    class Generator(torch.Generator):  # a C type: its methods cannot be patched in place
        def manual_seed(self, seed: Any) -> Any:
            log.note("torch.Generator().manual_seed", [seed])
            return super().manual_seed(seed)

    torch.Generator = Generator  # type: ignore[misc]
    return log


class _CountedLines:
    """The program's standard output, counting the lines written to it."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.lines = stream, 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: list[str]) -> int:
    result, steps, program, *args = argv
    sys.stdout = _CountedLines(sys.stdout)
    recorder = TorchRecorder(int(steps))
    install(recorder)
    seeds = install_seeds(recorder, program)
    recorder.record.update(run_program(program, args))
    recorder.record["seeds"] = seeds.calls
    with open(result, "wb") as f:
        pickle.dump(recorder.record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
