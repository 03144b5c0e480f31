"""The JAX side of ``verify --program`` (the nnx target): run the converted program unchanged,
observed, from the torch side's start.

``python -m torch2jax.verify.program_jax RESULT TORCH_RECORD STEPS PROGRAM [ARGS...]`` runs
PROGRAM as ``__main__`` under ``jax.disable_jit()`` (the converted code as written, executed
eagerly, so that the values crossing the hooks are concrete). At the first ``nnx.Optimizer``
the model receives the torch side's initial ``state_dict`` (the ``weights`` command's transfer)
and its nnx.Dropout modules go to rate 0; the model's class replays, at its k-th outermost
call, the arrays torch's model received at its k-th forward call; the k-th batch a grain
dataset yields to the program is torch's k-th ``DataLoader`` batch (labels included). Every
``Optimizer.update`` records the learning rates of the optimizer state
(``optax.inject_hyperparams``), every ``value_and_grad`` the loss it returns, and the integer
seeds the program's own code gives ``jax.random.key`` and its kin are recorded; after each
update the parameters, the optimizer state and a weight-decay probe are taken, and after
STEPS updates the program is stopped.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

from torch2jax.verify.program_common import (
    ProgramStopped,
    SeedLog,
    batch_leaves,
    in_constructor,
    randint_kind,
    rebuild_batch,
    run_program,
    wrap_iter,
)


def _parameters() -> Any:
    """The filter of a converted model's parameters in torch's sense: its ``nnx.Param``s and
    the ones the program froze (``freeze_parameters`` makes them ``FrozenParam``s)."""
    from flax import nnx

    return nnx.Any(nnx.Param, lambda _, v: type(v).__name__ == "FrozenParam")


def _keys(path: tuple) -> tuple[str, ...]:
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
        else:
            out.append(str(k))
    return tuple(out)


def _leaves(tree: Any) -> list[tuple[tuple[str, ...], Any]]:
    import jax

    return [(_keys(p), v) for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _learning_rates(opt_state: Any) -> list[float]:
    return [float(np.asarray(v)) for path, v in _leaves(opt_state)
            if path and path[-1] == "learning_rate" and "hyperparams" in path]


def _with_hyperparams(fresh: Any, before: Any) -> Any:
    """``fresh`` (a newly initialised optax state) with the injected hyperparameters and
    schedule states of ``before`` (the same optimizer's state), wherever both hold them."""
    if hasattr(fresh, "hyperparams_states") and hasattr(before, "hyperparams_states"):
        return fresh._replace(hyperparams=before.hyperparams,
                              hyperparams_states=before.hyperparams_states)
    if isinstance(fresh, tuple) and isinstance(before, tuple) and len(fresh) == len(before):
        items = [_with_hyperparams(a, b) for a, b in zip(fresh, before, strict=True)]
        return fresh._make(items) if hasattr(fresh, "_make") else type(fresh)(items)
    if isinstance(fresh, dict) and isinstance(before, dict) and fresh.keys() == before.keys():
        return type(fresh)({k: _with_hyperparams(v, before[k]) for k, v in fresh.items()})
    return fresh


class JaxRecorder:
    def __init__(self, steps: int, torch_record: dict[str, Any]) -> None:
        self.steps, self.torch = steps, torch_record
        self.record: dict[str, Any] = {"losses": [], "loss_steps": [], "lrs": [], "notes": [],
                                       "steps": 0, "replayed": 0, "replay_problems": [],
                                       "batches": 0, "batch_arrays": 0, "trace": [],
                                       "draws": 0, "draw_calls": 0, "program_draws": 0}
        self.program_draws: list[tuple[str | None, Any]] | None = None  # torch's, to replay
        self.model_class: Any = None
        self.mappings: list[dict[str, Any]] = []
        self.calls = 0
        self.depth = 0  # inside a value_and_grad
        self.in_forward = False
        self.optimizers = 0
        self.optimizer: Any = None  # the first nnx.Optimizer's transform: its updates are steps
        self.copies: set[int] = set()  # ids of copies of the model (not replayed)
        self.draws: list[tuple[str | None, np.ndarray]] = []  # this forward's torch draws

    # --- the start ------------------------------------------------------------------------
    def on_optimizer(self, model: Any) -> None:
        from flax import nnx

        from torch2jax.weights import format_nnx_path, plan_array_transfer

        if isinstance(model, tuple):  # (one optimizer of several models: the first's)
            model = model[0]
        self.optimizers += 1
        if self.optimizers > 1:
            if self.optimizers == 2:
                self.record["notes"].append(
                    "more than one nnx.Optimizer: the first one's updates are the steps "
                    "compared, and its model is the one fed (as torch's first optimizer's)")
            return
        init = self.torch.get("init")
        copies = self._copies_of(model) if init is not None else []
        self.copies = {id(c) for c in copies}
        if init is None:
            self.record["notes"].append("the torch side found no model: weights not shared")
        else:
            plan = plan_array_transfer(init, model, None, self.torch.get("ties"),
                                       "torch initial tensor", self.torch.get("layer_rules"))
            if plan.problems:
                self.record["error"] = ("the torch model's initial weights do not fit the "
                                        "converted model: " + "; ".join(plan.problems[:5]))
                raise ProgramStopped
            import jax.numpy as jnp

            for slot, var in plan.variables.items():
                var.set_value(jnp.asarray(plan.values[slot], dtype=var.dtype))
            for copy in copies:  # an EMA copy made before the optimizer: torch's copy too
                same = plan_array_transfer(init, copy, None, self.torch.get("ties"),
                                           "torch initial tensor", self.torch.get("layer_rules"))
                for slot, var in same.variables.items():
                    var.set_value(jnp.asarray(same.values[slot], dtype=var.dtype))
            if copies:
                self.record["notes"].append(f"{len(copies)} copy(ies) of the model made before "
                                            "the optimizer given the same initial weights")
            self.mappings = [{"torch": m.torch_name, "status": m.status, "layout": m.layout,
                              "nnx": format_nnx_path(m.nnx_path) if m.nnx_path else "",
                              "nnx_shape": tuple(m.nnx_shape)} for m in plan.mappings]
        self._feed_others(model)
        n = 0
        for _, mod in nnx.iter_graph(model):
            if isinstance(mod, nnx.Dropout) and mod.rate:
                mod.rate = 0.0
                n += 1
        if n:
            self.record["notes"].append(f"JAX: {n} nnx.Dropout modules set to rate 0")
        self._replay_calls(type(model))

    def _copies_of(self, model: Any) -> list[Any]:
        """The other models of the model's class alive now whose arrays equal the model's
        (``ema = copy.deepcopy(model)`` before the optimizer): torch's copies hold torch's
        initial weights, so these take them too."""
        import gc

        import jax
        import numpy as np
        from flax import nnx

        def arrays(m: Any) -> list[np.ndarray]:  # (the parameters: an RNG key is no array)
            return [np.asarray(x) for x in jax.tree.leaves(nnx.state(m, _parameters()))]

        leaves = arrays(model)
        found = []
        for other in gc.get_objects():
            if type(other) is not type(model) or other is model:
                continue
            theirs = arrays(other)
            if len(theirs) == len(leaves) and all(
                    a.shape == b.shape and np.array_equal(a, b) for a, b in zip(leaves, theirs)):
                found.append(other)
        return found

    def _feed_others(self, model: Any) -> None:
        """The torch side's other models (a frozen teacher, a second network; by class
        name, one of each) give their initial weights to the converted program's model of
        that class, the only one of its name alive here."""
        import gc

        import jax.numpy as jnp
        from flax import nnx

        from torch2jax.weights import plan_array_transfer

        others = self.torch.get("others") or {}
        if not others:
            return
        modules = [m for m in gc.get_objects() if isinstance(m, nnx.Module)]
        inside = {id(x) for m in modules for _, x in nnx.iter_graph(m) if x is not m}
        outer = [m for m in modules if id(m) not in inside and m is not model]
        fed = []
        for name, torch_model in others.items():
            found = [m for m in outer if type(m).__name__ == name]
            if len(found) != 1:
                continue
            plan = plan_array_transfer(torch_model["init"], found[0], None, None,
                                       "torch initial tensor", torch_model["layer_rules"])
            if plan.problems:
                self.record["notes"].append(f"{name}'s initial weights not shared: "
                                            + "; ".join(plan.problems[:3]))
                continue
            for slot, var in plan.variables.items():
                var.set_value(jnp.asarray(plan.values[slot], dtype=var.dtype))
            fed.append(name)
        if fed:
            self.record["notes"].append("other models given torch's initial weights: "
                                        + ", ".join(sorted(fed)))

    def _replay_calls(self, cls: type) -> None:
        original = cls.__call__
        recorder = self

        def call(this: Any, *args: Any, **kwargs: Any) -> Any:
            if recorder.in_forward or id(this) in recorder.copies:  # (torch's hooks: the model's)
                return original(this, *args, **kwargs)
            args, kwargs = recorder.replay(args, kwargs)
            recorder.start_draws(recorder.calls - 1)
            recorder.in_forward = True
            try:
                return original(this, *args, **kwargs)
            finally:
                recorder.in_forward = False

        cls.__call__ = call  # type: ignore[method-assign]

    def replay(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        forwards = self.torch.get("forwards", [])
        k, self.calls = self.calls, self.calls + 1
        if k >= len(forwards):
            self._problem(f"forward call {k + 1}: torch's model was called {len(forwards)} "
                          "times before its last step; inputs not replayed")
            return args, kwargs
        t_args, t_kwargs = forwards[k]
        new_args = tuple(self._substitute(a, t_args[i] if i < len(t_args) else None,
                                          f"forward call {k + 1}, argument {i}")
                         for i, a in enumerate(args))
        new_kwargs = {n: self._substitute(v, t_kwargs.get(n), f"forward call {k + 1}, {n}=")
                      for n, v in kwargs.items()}
        return new_args, new_kwargs

    def start_draws(self, k: int) -> None:
        """The draws torch's model made in its k-th forward call, to be replayed in order by the
        JAX model's draws of the same kind and shape in its k-th call (none when one of
        torch's has no JAX counterpart)."""
        draws = self.torch.get("draws", [])
        self.draws = list(draws[k]) if k < len(draws) else []
        if any(kind is None for kind, _ in self.draws):
            self._problem(f"forward call {k + 1}: a torch draw with no JAX counterpart "
                          "(torch.normal, multinomial, ...): its draws are not replayed")
            self.draws = []
        elif self.draws:
            self.record["draw_calls"] += 1

    def draw(self, kind: str, shape: Any, dtype: Any) -> Any:
        """The next torch draw of this forward, for a JAX draw of ``kind`` and ``shape``; None
        (the JAX draw runs) when there is none or it does not fit."""
        import jax.numpy as jnp

        if not self.in_forward:
            return self.program_draw(kind, shape, dtype)
        if not self.draws:
            return None
        t_kind, value = self.draws[0]
        if t_kind != kind or tuple(value.shape) != tuple(shape):
            self._problem(f"forward call {self.calls}: JAX draws {kind} {tuple(shape)}, torch's "
                          f"next draw is {t_kind} {tuple(value.shape)}: the rest of the call's "
                          "draws are not replayed")
            self.draws = []
            return None
        self.draws.pop(0)
        self.record["draws"] += 1
        return jnp.asarray(value, dtype=dtype)

    def program_draw(self, kind: str, shape: Any, dtype: Any) -> Any:
        """Torch's next draw outside its model's forward (the program's data, another model's
        forward), for this draw outside the model's forward and outside a module's
        constructor; None (the JAX draw runs) when there is none. A draw of another kind or
        shape than torch's next ends the replay of the program's draws: from there on they
        are the JAX program's own."""
        import jax.numpy as jnp
        from flax import nnx

        if self.program_draws is None:
            self.program_draws = list(self.torch.get("program_draws", []))
        if not self.program_draws or in_constructor(nnx.Module):
            return None
        while self.program_draws and self.program_draws[0][0] is None:
            self.program_draws.pop(0)  # (a torch.randperm: the JAX side's is not patched)
        if not self.program_draws:
            return None
        t_kind, value = self.program_draws[0]
        if t_kind != kind or tuple(value.shape) != tuple(shape):
            self.record["notes"].append(
                f"the program's draws replayed up to its draw {self.record['program_draws'] + 1}"
                f": JAX draws {kind} {tuple(shape)}, torch {t_kind} {tuple(value.shape)}")
            self.program_draws = []
            return None
        self.program_draws.pop(0)
        self.record["program_draws"] += 1
        return jnp.asarray(value, dtype=dtype)

    def _substitute(self, value: Any, torch_value: Any, where: str,
                    count: str = "replayed") -> Any:
        import jax.numpy as jnp

        if not isinstance(torch_value, np.ndarray) or not hasattr(value, "shape"):
            return value
        if tuple(value.shape) != torch_value.shape:
            self._problem(f"{where}: JAX shape {tuple(value.shape)}, torch "
                          f"{torch_value.shape}; not replayed")
            return value
        self.record[count] += 1
        if isinstance(value, np.ndarray):  # a grain batch is numpy: it stays numpy
            return np.asarray(torch_value, dtype=value.dtype)
        return jnp.asarray(torch_value, dtype=value.dtype)

    def on_batch(self, batch: Any) -> Any:
        """The program's k-th batch from a grain dataset, with torch's k-th DataLoader batch's
        arrays in its place (each of the same shape; the JAX dtype kept)."""
        batches = self.torch.get("batches", [])
        k = self.record["batches"]
        self.record["batches"] += 1
        if k >= len(batches):
            if batches:
                self._problem(f"batch {k + 1}: torch's loaders yielded {len(batches)} batches "
                              "before its last step; not replayed")
            return batch
        ours, theirs = batch_leaves(batch), batches[k]
        if len(ours) != len(theirs):
            self._problem(f"batch {k + 1}: {len(ours)} arrays, torch's {len(theirs)}; "
                          "not replayed")
            return batch
        new = [self._substitute(a, b, f"batch {k + 1}, array {i}", "batch_arrays")
               for i, (a, b) in enumerate(zip(ours, theirs, strict=True))]
        return rebuild_batch(batch, new)

    def _problem(self, text: str) -> None:
        if len(self.record["replay_problems"]) < 10:
            self.record["replay_problems"].append(text)

    # --- steps ----------------------------------------------------------------------------
    def on_loss(self, value: Any) -> None:
        if self.depth == 0 and np.size(value) == 1:
            self.record["losses"].append(float(np.asarray(value)))
            self.record["loss_steps"].append(self.record["steps"] + 1)

    def on_update(self, optimizer: Any, model: Any, original: Any, grads: Any,
                  kwargs: dict) -> Any:
        from flax import nnx

        # (by its transform: a jit's copy of the optimizer holds the same one)
        if self.optimizer is None:
            self.optimizer = optimizer.tx
        if optimizer.tx is not self.optimizer:  # (another model's: a GAN's generator, ...)
            return original(optimizer, model, grads, **kwargs)
        before = nnx.as_pure(optimizer.opt_state)
        out = original(optimizer, model, grads, **kwargs)
        several = isinstance(model, tuple)  # (one optimizer of several models: the first's)
        if several:
            model = model[0]
        # the rates this update used: optax.inject_hyperparams computes a scheduled value at
        # the update and keeps it in the new state (the state before holds the previous
        # update's); a value set by hand before the update is kept as it was set
        self.record["lrs"].append(_learning_rates(nnx.as_pure(optimizer.opt_state)))
        self.record["steps"] += 1
        self.snapshot(optimizer, model, before, several)
        if self.record["steps"] >= self.steps:
            raise ProgramStopped
        return out

    def snapshot(self, optimizer: Any, model: Any, before: Any = None,
                 several: bool = False) -> None:
        """The parameters, optimizer state and decay probe after a step. ``several``: the
        optimizer holds a tuple of models, ``model`` the first (its state's paths start
        with its index, 0)."""
        from flax import nnx

        from torch2jax.weights import format_nnx_path

        # (and the frozen ones: the converted requires_grad_(False) makes a parameter a
        # FrozenParam, which torch keeps among its parameters, unchanged by the steps)
        params = {format_nnx_path(p): np.asarray(v.get_value())
                  for p, v in nnx.to_flat_state(nnx.state(model, _parameters()))}
        first = ("0",) if several else ()
        by_path = {(*first, *m["nnx"].split(".")): m["torch"] for m in self.mappings
                   if m["status"] == "mapped"}
        opt_state: dict[str, dict[str, np.ndarray]] = {}
        for path, leaf in _leaves(nnx.as_pure(optimizer.opt_state)):
            for start in range(1, len(path)):
                name = by_path.get(path[start:])
                if name is not None and np.ndim(leaf):
                    opt_state.setdefault(name, {})[path[start - 1]] = np.asarray(leaf)
                    break
        self.record["trace"].append({"params": params, "opt_state": opt_state,
                                     "decay": self.decay_probe(optimizer, model, before)})
        self.record.update(self.record["trace"][-1])  # the last step's, at the top

    def decay_probe(self, optimizer: Any, model: Any,
                    before: Any = None) -> dict[str, tuple[bool, float | None]]:
        """The torch side's probe (program_torch.TorchRecorder.decay_probe): the optimizer's
        transform from a fresh state, zero gradients, the current parameters; ``lr`` is the
        fresh state's injected learning rate (None without one: the amount is not compared).
        ``before``: the state the last update started from, whose injected hyperparameters
        and schedule counts the fresh state takes, so that the probe runs with the rates of
        that step (torch's probe reads the param groups' current lr and momentum)."""
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from torch2jax.weights import format_nnx_path

        params = nnx.as_pure(nnx.state(model, optimizer.wrt))
        fresh = optimizer.tx.init(params)
        if before is not None:
            fresh = _with_hyperparams(fresh, before)
        zeros = jax.tree.map(jnp.zeros_like, params)
        updates, _ = optimizer.tx.update(zeros, fresh, params)
        rates = set(_learning_rates(nnx.as_pure(optimizer.opt_state) if before is not None
                                    else fresh))
        lr = rates.pop() if len(rates) == 1 else None
        flat_p = dict(_leaves(params))
        out: dict[str, tuple[bool, float | None]] = {}
        for path, u in _leaves(updates):
            p = np.asarray(flat_p[path], dtype=np.float64)
            u = np.asarray(u, dtype=np.float64)
            norm = float((p * p).sum())
            decay = -float((u * p).sum()) / (lr * norm) if lr and norm else None
            out[format_nnx_path(path)] = (bool((u != 0).any()), decay)
        return out


def _record_value(recorder: JaxRecorder, transform: Any) -> Any:
    """``transform`` (a ``value_and_grad``) whose functions record the value they return."""

    def patched(*args: Any, **kwargs: Any) -> Any:
        if not args or not callable(args[0]):  # decorator form: value_and_grad(has_aux=...)
            return lambda f: patched(f, *args, **kwargs)
        fn = transform(*args, **kwargs)
        has_aux = kwargs.get("has_aux", False)

        def wrapped(*a: Any, **k: Any) -> Any:
            recorder.depth += 1
            try:
                out = fn(*a, **k)
            finally:
                recorder.depth -= 1
            value = out[0][0] if has_aux else out[0]
            recorder.on_loss(value)
            return out

        return wrapped

    return patched


def install(recorder: JaxRecorder) -> None:
    import jax
    from flax import nnx

    original_init = nnx.Optimizer.__init__
    original_update = nnx.Optimizer.update

    def init(self: Any, model: Any, *args: Any, **kwargs: Any) -> None:
        recorder.on_optimizer(model)
        original_init(self, model, *args, **kwargs)
        if recorder.optimizer is None:
            recorder.optimizer = self.tx

    def update(self: Any, model: Any, grads: Any, /, **kwargs: Any) -> Any:
        return recorder.on_update(self, model, original_update, grads, kwargs)

    nnx.Optimizer.__init__ = init  # type: ignore[method-assign]
    nnx.Optimizer.update = update  # type: ignore[method-assign]
    nnx.value_and_grad = _record_value(recorder, nnx.value_and_grad)
    jax.value_and_grad = _record_value(recorder, jax.value_and_grad)
    install_loaders(recorder)
    install_draws(recorder)


def install_draws(recorder: JaxRecorder) -> None:
    """``jax.random``'s draws inside the model's outermost call take torch's values
    (TorchRecorder.on_draw) where the kind and shape agree. A uniform draw between other
    bounds than [0, 1) (``minval``/``maxval``, torch's ``uniform_(a, b)``, which is not
    recorded) is no ``torch.rand``: it is not replayed."""
    import jax

    def patched(kind: str, original: Any) -> Any:
        def draw(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)  # drawn anyway: the shape and dtype it has
            if kind == "uniform" and (len(args) > 3 or {"minval", "maxval"} & set(kwargs)):
                kind_seen = "uniform between other bounds"
            elif kind == "randint":  # randint(key, shape, minval, maxval)
                kind_seen = randint_kind(kwargs.get("minval", args[2] if len(args) > 2 else None),
                                         kwargs.get("maxval", args[3] if len(args) > 3 else None))
            else:
                kind_seen = kind
            value = recorder.draw(kind_seen, out.shape, out.dtype)
            return out if value is None else value

        return draw

    for kind in ("normal", "uniform", "randint", "bernoulli"):
        setattr(jax.random, kind, patched(kind, getattr(jax.random, kind)))


def install_loaders(recorder: JaxRecorder) -> None:
    """Every grain dataset class's ``__iter__`` (``IterDataset`` subclasses define their own)
    replays torch's batches."""
    try:
        import grain
    except ImportError:
        return
    guard = [False]
    seen: set[type] = set()
    todo = [grain.MapDataset, grain.IterDataset]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo += cls.__subclasses__()
        if "__iter__" in cls.__dict__:
            wrap_iter(cls, recorder.on_batch, guard)


def install_seeds(recorder: JaxRecorder, program: str) -> SeedLog:
    import jax
    from flax import nnx

    log = SeedLog(Path(program).parent, lambda: recorder.record["steps"] + 1)
    log.patch_common()
    log.patch(jax.random, "key", "jax.random.key")
    log.patch(jax.random, "PRNGKey", "jax.random.PRNGKey")
    log.patch_init(nnx.Rngs, "nnx.Rngs")
    try:
        import grain
    except ImportError:
        return log
    for attr in ("shuffle", "random_map"):
        log.patch_method(grain.MapDataset, attr, f"grain.MapDataset.{attr}")
    return log


def compilation_cache() -> None:
    """Eager execution compiles each primitive once per shape; keep those compilations on
    disk (``$XDG_CACHE_HOME/torch2jax/jax``, unless the user chose a JAX cache) so that the
    next run of the same program reuses them (measured: 17 s of CPU time to 6 s on the
    fixture GPT). The cache changes speed only."""
    import os
    from pathlib import Path

    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    jax.config.update("jax_compilation_cache_dir", str(base / "torch2jax" / "jax"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main(argv: list[str]) -> int:
    import jax

    compilation_cache()
    result, torch_record, steps, program, *args = argv
    with open(torch_record, "rb") as f:
        record = pickle.load(f)
    recorder = JaxRecorder(int(steps), record)
    install(recorder)
    seeds = install_seeds(recorder, program)
    with jax.disable_jit():
        outcome = run_program(program, args)
    recorder.record["seeds"] = seeds.calls
    recorder.record["seeded_sources"] = seeds.sources
    if "error" in recorder.record:
        outcome.update(error=recorder.record.pop("error"), stopped=False)
    recorder.record.update(outcome)
    recorder.record["mappings"] = recorder.mappings
    with open(result, "wb") as f:
        pickle.dump(recorder.record, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
