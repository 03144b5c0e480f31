"""Data and randomness: datasets, loaders, samplers, torch.distributed, torch.Generator
variables, and the keys that random draws split (passes/data.py holds the translations).

A mixin of :class:`torch2jax.passes.rewrite.TorchToJax` (one traversal): its methods read
the transformer's per-file state through ``self``."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from torch2jax.analysis import host as ha
from torch2jax.analysis.metadata import ParentNodeProvider, PositionProvider
from torch2jax.analysis.walk import findall
from torch2jax.passes import comprehension_keys as cf
from torch2jax.passes import data as dt
from torch2jax.passes import host_data as hd
from torch2jax.passes import loader_dicts as ld
from torch2jax.passes import norm_reset
from torch2jax.passes import training as tr
from torch2jax.passes.common import (
    Untranslatable,
    bind,
    code,
    expr,
)
from torch2jax.passes.rewrite_support import _fix_commas

_GLOBAL_DRAWS_NOTE = ("the dataset's draws from torch's global generator come from numpy's "
                      "global generator (one host stream for the process, as torch's is), ")
# where a program never seeds torch: numpy's global generator seeded at import, as a fixed
# stream (torch's unseeded stream differs at every run)
_UNSEEDED = "np.random.seed(0)  # torch's global generator is never seeded: a fixed stream\n"


class DataMixin:
    def _dataset_class(self, original_node, updated_node):
        """class Points(Dataset): -> class Points: (grain reads __len__ and __getitem__)."""
        keep = []
        for b, ob in zip(updated_node.bases, original_node.bases):
            q = self.q(ob.value)
            if q in dt.DATASET_BASES:
                continue
            if q in dt.ITERABLE_BASES:
                continue  # a plain iterable: its loader is an IterableLoader
            keep.append(b)
        if len(keep) == len(updated_node.bases):
            return updated_node
        self.need("jax")
        body = []
        global_draws = False
        for st, ost in zip(updated_node.body.body, original_node.body.body):
            host = self._host_method(ost) if isinstance(ost, cst.FunctionDef) else None
            if host is not None:
                st, draws = host
                global_draws |= draws
            elif isinstance(st, cst.FunctionDef) and st.name.value == "__init__":
                st = dt.host_arrays(st)
            body.append(st)
        updated_node = updated_node.with_changes(body=updated_node.body.with_changes(body=body))
        if global_draws:  # (at the class: its methods' lines are written anew)
            self.diag(original_node, "random", "info", _GLOBAL_DRAWS_NOTE + (
                "which the translation of the program's torch.manual_seed seeds too (in "
                "whichever file it stands)" if self.data.torch_seeded else
                "seeded with 0 where this file is imported: no file of the program converted "
                "with it seeds torch's global generator (torch would draw another stream at "
                "every run; a torch.manual_seed run after this import still seeds it)"))
            self._unseeded_global_draws |= not self.data.torch_seeded
        if not keep:
            return updated_node.with_changes(bases=[], lpar=cst.MaybeSentinel.DEFAULT,
                                             rpar=cst.MaybeSentinel.DEFAULT)
        return updated_node.with_changes(bases=_fix_commas(keep))

    def _dataset_draw(self, original: cst.Call, updated: cst.Call, name: str
                      ) -> cst.BaseExpression | None:
        """A draw from torch's global generator in a method of a Dataset class that stays on
        the ``jnp`` route (its ``__init__`` making synthetic data with ``F.avg_pool2d``, off
        the numpy table): the dataset is built and read on the host, so the draw is numpy's
        global generator's (as the numpy route's, passes/host_data.py: one host stream that
        the program's torch.manual_seed seeds), where a JAX key would need plumbing into the
        class and a device round trip per item. None for any other draw."""
        if name not in tr.HOST_RANDOM or any(
                a.keyword is not None and a.keyword.value in ("generator", "out")
                for a in original.args):
            return None
        at = self.get_metadata(ParentNodeProvider, original, None)
        while at is not None and not isinstance(at, cst.ClassDef):
            at = self.get_metadata(ParentNodeProvider, at, None)
        if at is None or not any(self.q(b.value) in dt.DATASET_BASES | dt.ITERABLE_BASES
                                 for b in at.bases):
            return None
        drawn = tr.host_random_call(name, updated, global_draws=True)
        self.need("np")
        self._unseeded_global_draws |= not self.data.torch_seeded
        if not self.data.torch_seeded:
            self.diag(original, "random", "info", _GLOBAL_DRAWS_NOTE + (
                "seeded with 0 where this file is imported: no file of the program converted "
                "with it seeds torch's global generator"))
        return drawn

    def _host_method(self, original: cst.FunctionDef) -> tuple[cst.FunctionDef, bool] | None:
        """A Dataset method that reads torch, in numpy (passes/host_data.py), and whether it
        draws from numpy's global generator (torch's global one's draws); None when the table
        does not cover it. The rewriter's diagnostics inside it are withdrawn: the method is
        written anew."""
        if not hd.reads_torch(original, self.q):
            return None
        translated = hd.numpy_method(original, self.q, global_draws=True)
        if translated is None:
            return None
        host, draws = translated
        self.need("np")
        try:
            span = self.get_metadata(PositionProvider, original)
        except KeyError:
            return None
        self.rewritten_lines.append((span.start.line, span.end.line))
        return host, draws

    def _data_assign(self, original_node: cst.Assign, updated_node: cst.Assign):
        """Samplers and scalers (consumed where they are used) and per-epoch loaders."""
        target = original_node.targets[0].target if len(original_node.targets) == 1 else None
        why = self.data.loader_dicts.refused.get(id(original_node))
        if why is not None:
            self.diag(original_node, "torch.utils.data.DataLoader", "error", why)
        if not isinstance(target, cst.Name) or not isinstance(original_node.value, cst.Call):
            return None
        q = self.q(original_node.value.func) or ""
        name = target.value
        if q in dt.SAMPLERS and name in self.data.samplers or (
                q in dt.BATCH_SAMPLERS and name in self.data.batch_samplers):
            return cst.RemoveFromParent()  # read by the DataLoader that uses it
        if self.data.seeded_draw(name):
            # g = torch.Generator().manual_seed(s), read by torch.randn(..., generator=g)
            self.need("jax")
            return updated_node.with_changes(value=expr(
                "jax.random.key({s})", s=self.data.generators[name]))
        if self._consumed_generator(name):
            return cst.RemoveFromParent()  # its seed is the shuffle seed of what reads it
        seed = self.data.numpy_generators.assigns.get(id(original_node))
        if seed is not None:  # a generator passed around as an object: a numpy Generator
            self.need("np")
            return updated_node.with_changes(value=expr(f"np.random.default_rng({seed})"))
        if q in dt.SCALERS:
            self.diag(original_node, q, "info", "GradScaler removed: the autocast region "
                      "computes in bfloat16, which needs no loss scaling")
            return cst.RemoveFromParent()
        site = self.data.loaders.get(name)
        if q in dt.LOADERS and site is not None and site.shuffled:
            try:
                expanded, warnings = dt.expand_loader_kwargs(
                    original_node.value, updated_node.value, self.get_metadata)
                expanded, built = _dataset_bound_once(expanded, f"{name}_dataset")
                pipeline, notes = dt.loader_pipeline(original_node.value, expanded, self.q,
                                                     self.data, "epoch")
            except Untranslatable as exc:
                self.diag(original_node, exc.rule or q, "error", exc.message)
                return None
            for note in notes:
                self.diag(original_node, q, "info", note)
            for note in warnings:
                self.diag(original_node, q, "warning", note)
            self.need("grain", *(["np"] if self.data.drawn_seed else []))
            blank = [cst.EmptyLine(indent=False)]
            if built is not None:
                self._pending[-1].after.append(built)
            self._pending[-1].after.append(dt.loader_function(name, "epoch", pipeline, blank))
            return cst.RemoveFromParent()
        return None

    def _loader_loop(self, original_node, updated_node):
        """for x, y in loader: -> for x, y in loader(epoch): (a loader shuffled per epoch), also
        where the loop wraps it: enumerate(loader), tqdm(loader), zip(loader, ...)."""
        epoch = self._epoch_of(self._for_stack[:-1])
        return updated_node.with_changes(iter=self._epoch_loaders(updated_node.iter, epoch))

    def _epoch_of(self, loops) -> str:
        """The epoch a loader shuffled per epoch is read for, inside ``loops``: the innermost
        loop's variable, but for a loop over a literal list (``for phase in ["train",
        "val"]`` names no epoch); outside any, the function's ``epoch`` parameter (``def
        train(epoch)``: a new order each epoch), else 0."""
        outer = [f.target.value for f in loops if isinstance(f.target, cst.Name)
                 and not isinstance(f.iter, (cst.List, cst.Tuple, cst.Set))]
        if outer:
            return outer[-1]
        if self._param_names and "epoch" in self._param_names[-1]:
            return "epoch"
        return "0"

    def _epoch_loaders(self, it: cst.BaseExpression, epoch: str) -> cst.BaseExpression:
        """``it`` with each loader shuffled per epoch, bare or an argument of the calls that wrap
        it, called with ``epoch``."""
        if isinstance(it, cst.Name) and it.value in self.data.loaders and (
                self.data.loaders[it.value].shuffled) and not self._shadowed(it.value):
            return expr(f"{it.value}({epoch})")
        if isinstance(it, cst.Call):
            return it.with_changes(args=[a.with_changes(value=self._epoch_loaders(a.value, epoch))
                                         for a in it.args])
        if m.matches(it, m.Subscript(value=m.Name())) and it.value.value in (
                self.data.loader_dicts.names) and not self._shadowed(it.value.value):
            return ld.item_read(it, epoch)  # dataloaders[phase](epoch)
        return it

    def _loader_dict_item(self, original_node: cst.Subscript, updated_node: cst.Subscript):
        """An item of a dict of loaders read outside a loop's iterable (``run(loaders["train"])``
        in the epoch loop, ``len(dataloaders["train"])``): the pipeline of the epoch around it,
        else of epoch 0 (passes/loader_dicts.py)."""
        if not (isinstance(original_node.value, cst.Name) and original_node.value.value in (
                self.data.loader_dicts.names)) or self._shadowed(original_node.value.value):
            return None
        node, parent = original_node, self.get_metadata(ParentNodeProvider, original_node, None)
        while parent is not None and not isinstance(parent, cst.BaseStatement):
            if isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is node:
                return None  # iterated: the loop's epoch (_epoch_loaders)
            node, parent = parent, self.get_metadata(ParentNodeProvider, parent, None)
        if isinstance(parent, cst.For) and parent.iter is node:
            return None
        return ld.item_read(updated_node, self._epoch_of(self._for_stack))

    def _loader_dict_element(self, original_node: cst.DictElement, updated_node):
        """A loader that does not shuffle, in a dict of epoch functions: a function too."""
        if id(original_node.value) in self.data.loader_dicts.wrapped:
            return updated_node.with_changes(value=ld.wrapped_loader(updated_node.value))
        return updated_node

    def _all_gather(self, original: cst.Expr, call: cst.Call, q: str):
        """all_gather(out, x) in a world of one process: ``out`` receives ``x`` alone."""
        b = bind(call.args, ("out", "value"))
        out, value = b.get("out"), b.get("value")
        if out is None or value is None or q.endswith("_into_tensor") and not isinstance(
                out, cst.Name):
            self.diag(original, q, "error", f"{q.rsplit('.', 1)[1]} with arguments that are "
                      "not (output, value)")
            return None
        self.diag(original, q, "info", f"{q.rsplit('.', 1)[1]}() over a world of one process: "
                  "the JAX script is one program, so the value is already the global one")
        if q.endswith("_into_tensor"):
            return cst.Assign([cst.AssignTarget(out)], value)
        return cst.Assign([cst.AssignTarget(expr("{o}[:]", o=out))],
                          cst.List([cst.Element(value)]))

    def _data_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        """torch.distributed calls, sampler epochs and GradScaler calls used as statements."""
        value = original_node.value
        if not isinstance(value, cst.Call):
            return None
        q = self.q(value.func) or ""
        if q in dt.DIST_DROPPED:
            self.diag(original_node, q, "info", f"{q.rsplit('.', 1)[1]}() removed: a "
                      "collective over a world of one process (the JAX script is one "
                      "program; XLA adds the collectives its sharded computations need)")
            return cst.RemoveFromParent()
        if q in dt.DEVICE_DROPPED:
            self.diag(original_node, q, "info", f"{q}() removed: JAX puts arrays on the "
                      "default device (jax.devices() lists the others)")
            return cst.RemoveFromParent()
        if q in dt.DIST_GATHERS:
            return self._all_gather(original_node, updated_node.value, q)
        if q == dt.DIST_INIT:
            self.need("os", "jax")
            self.diag(original_node, q, "info", "init_process_group -> "
                      "jax.distributed.initialize() on several hosts; one host needs nothing")
            self._pending[-1].after.append(dt.distributed_init())
            return cst.RemoveFromParent()
        func = value.func
        if not isinstance(func, cst.Attribute):
            return None
        meth = func.attr.value
        recv = func.value
        if isinstance(recv, cst.Name) and meth == "manual_seed" and self._consumed_generator(
                recv.value):
            return cst.RemoveFromParent()
        if isinstance(recv, cst.Name) and recv.value in self.data.samplers and (
                meth == "set_epoch"):
            return cst.RemoveFromParent()  # the loader's shuffle seed adds the epoch
        if isinstance(recv, cst.Name) and recv.value in self.data.scalers:
            if meth in ("update", "unscale_"):
                return cst.RemoveFromParent()
            if meth == "step" and value.args:
                return updated_node.with_changes(value=cst.Call(func=cst.Attribute(
                    value=updated_node.value.args[0].value, attr=cst.Name("step"))))
            return None
        # scaler.scale(loss).backward() -> loss.backward()
        if meth == "backward" and m.matches(recv, m.Call(func=m.Attribute(
                value=m.Name(), attr=m.Name("scale")))) and recv.func.value.value in (
                self.data.scalers) and recv.args:
            inner = updated_node.value.func.value.args[0].value
            return updated_node.with_changes(value=updated_node.value.with_changes(
                func=cst.Attribute(value=inner, attr=cst.Name("backward"))))
        return None

    def _torch_machinery_statement(self, original_node: cst.Expr, updated_node: cst.Expr):
        """``torch.fx.wrap("f")`` (registers f as a leaf for torch.fx tracing): removed;
        ``torch._assert(cond, msg)`` (an assert that torch.fx can trace): ``assert cond, msg``
        (shapes are static under jax.jit, so the conditions torchvision writes stay checked)."""
        value = original_node.value
        if not isinstance(value, cst.Call):
            return None
        reset = norm_reset.reset_call(self, value, updated_node.value)
        if reset is not None:  # m.reset_parameters() of a torch norm layer
            return updated_node.with_changes(value=reset)
        q = self.q(value.func)
        if q == "torch.fx.wrap":
            self.diag(original_node, q, "info", "torch.fx.wrap(...) removed: a torch.fx tracing "
                      "hint")
            return cst.RemoveFromParent()
        if m.matches(value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("step")))) and (
                value.args and value.func.value.value in self.training.optimizer_names):
            # (passes/step_closures.py writes out the closures it can show are the same)
            self.diag(original_node, "training-loop", "error",
                      f"{code(value)} not translated: write the closure's statements out before "
                      f"{value.func.value.value}.step() (torch's optimizers call it once; "
                      "L-BFGS calls it up to max_iter times, with a line search)")
            return None
        if q == "torch._assert" and len(updated_node.value.args) in (1, 2):
            args = updated_node.value.args
            return cst.Assert(test=args[0].value, msg=args[1].value if len(args) == 2 else None)
        return None

    # ------------------------------------------------------------------ randomness
    def _subkey(self, node) -> cst.BaseExpression:
        if self._in_expr_scope:
            frame = self._comp_frames[-1] if self._comp_frames else None
            if frame is None or not self._pending:
                raise Untranslatable("random draw inside a lambda or comprehension: each draw "
                                     "needs its own key; make it a loop", rule="random")
            # one key split for the statement, folded with each element's index
            depth, self._in_expr_scope = self._in_expr_scope, 0
            try:
                base = self._subkey(node)
            finally:
                self._in_expr_scope = depth
            return cf.folded(base, frame) if isinstance(base, cst.Name) else base
        scope = self._key_scopes[-1]
        if not scope.has_key:
            if self.target.setup_modules and self._linen_param_draw(node):
                # linen: self.w = self.param("w", lambda key: <the draw>), the key given
                return cst.Name("key")
            if len(self._key_scopes) == 1:
                scope.root_needed = scope.has_key = True
                self.diag(node, "random", "warning",
                          "random draw without torch.manual_seed: a root key "
                          "jax.random.key(0) is added at the top of the file")
            elif self.target.train_state and self.in_module_class() and (
                    self.current_class in self.training.method_draws):
                # linen: the stream apply is given a key for (rngs={"noise": key})
                return self._lt_draw_key()
            elif self.target.train_state and self._splits_script_key():
                # linen's main(): its draws split the script's key, as its model.init does
                scope.has_key = scope.global_key = True
            elif self._module_rngs():
                # a module's own random numbers at call time (a VAE's reparameterisation):
                # from the nnx.Rngs that __init__ keeps, whose state advances at every draw
                self.need("jax")
                return expr("self.rngs()")
            else:
                raise Untranslatable("random draw in a method: pass a key to it (or keep an "
                                     "nnx.Rngs on the module)", rule="random")
        self.need("jax")
        return self._pending[-1].keys.take()

    def _splits_script_key(self) -> bool:
        """In a function of the file (not a method) of a script seeded at its top, that names
        nothing ``key`` itself: its draws may split the script's key (``global key``)."""
        return bool(self._fn_stack) and not self._class_stack and len(self._key_scopes) == 2 \
            and self._key_scopes[0].has_key and "key" not in {
                n.value for n in findall(self._fn_stack[-1], m.Name())}

    def _linen_param_draw(self, node: cst.CSTNode) -> bool:
        """The only draw of an ``nn.Parameter(...)`` built in a module's ``__init__``
        (vit-pytorch's ``nn.Parameter(torch.randn(1, n + 1, dim))``): on linen, the parameter's
        init function, whose key it draws with."""
        if not (self.in_module_class() and self._fn_stack
                and self._fn_stack[-1].name.value == "__init__"):
            return False
        parent = self.get_metadata(ParentNodeProvider, node, None)
        while parent is not None and not isinstance(parent, (cst.Lambda, cst.FunctionDef,
                                                             cst.BaseStatement)):
            if isinstance(parent, cst.Call) and self.q(parent.func) == "torch.nn.Parameter":
                draws = [c for c in findall(parent, m.Call())
                         if (self.q(c.func) or "").startswith(("torch.rand", "torch.normal"))]
                return draws == [node]
            parent = self.get_metadata(ParentNodeProvider, parent, None)
        return False

    def _module_rngs(self) -> bool:
        """In a method of an NNX module class that draws random numbers outside __init__
        (the class keeps ``self.rngs = rngs.fork()``). Not for linen, whose modules draw
        with make_rng and a key given to apply. The equinox target reads ``self.rngs()`` as
        a key its forward pass takes (targets/equinox_forward.py, Forward.draw)."""
        return (self.target.stateful_modules and self.in_module_class()
                and self.current_class in self.training.method_draws)

    def _with_numpy_seed(self, body: list) -> list:
        """``np.random.seed(0)`` after the imports: the stream of a dataset's global draws in
        a program that never seeds torch (the stream stays fixed, as it was before issue 29)."""
        at = 0
        while at < len(body) and (m.matches(body[at], m.SimpleStatementLine(
                body=[m.Import() | m.ImportFrom()])) or (at == 0 and m.matches(
                body[at], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])))):
            at += 1
        stmt = cst.parse_statement(_UNSEEDED).with_changes(
            leading_lines=[cst.EmptyLine(indent=False)])
        return [*body[:at], stmt, *body[at:]]

    def _with_host_rng(self, original_node, body: list) -> list:
        """``host_rng = np.random.default_rng(SEED)`` after the statement that binds the seed
        (after the imports for a literal seed): the generator of the host-side draws."""
        host = self.data.host
        seed = code(host.seed) if host.seed is not None else "0"
        stmt = cst.parse_statement(f"{ha.GENERATOR} = np.random.default_rng({seed})\n")
        at = None
        if isinstance(host.seed, cst.Name):
            binds = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
                m.Name(host.seed.value))]) | m.AnnAssign(target=m.Name(host.seed.value))])
            at = next((i + 1 for i in range(len(body) - 1, -1, -1)
                       if m.matches(body[i], binds)), None)
            # after the block of constants the seed is defined in
            while at is not None and at < len(body) and isinstance(
                    body[at], cst.SimpleStatementLine) and m.matches(
                    body[at].body[0], m.Assign() | m.AnnAssign()) and not any(
                    ln.comment is None for ln in body[at].leading_lines):
                at += 1
        if at is None:
            at = 0
            while at < len(body) and (m.matches(body[at], m.SimpleStatementLine(
                    body=[m.Import() | m.ImportFrom()])) or (at == 0 and m.matches(
                    body[at], m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString())])))):
                at += 1
            stmt = stmt.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        return [*body[:at], stmt, *body[at:]]

    def _data_call(self, original: cst.Call, updated: cst.Call, name: str
                   ) -> cst.BaseExpression | None:
        """torch.distributed queries, DDP, TensorDataset, DataLoader (passes/data.py)."""
        transform = dt.transform_name(name)
        if transform in dt.TRANSFORMS:
            if transform in dt.RANDOM_TRANSFORMS:
                self.need("np")
            return dt.transform(transform, updated, self.data)
        if transform is not None or name.startswith("torchvision.datasets."):
            raise Untranslatable(
                f"{name}: no numpy counterpart written (the translated transforms are "
                f"{', '.join(sorted(dt.TRANSFORMS))})" if transform is not None else
                f"{name}: torchvision's datasets download and decode with torch; load the "
                "arrays with numpy (or tensorflow_datasets / datasets) into a Dataset class",
                rule=name)
        if name == "torch.distributed.get_rank":
            self.need("jax")
            return expr("jax.process_index()")
        if name == "torch.distributed.get_world_size":
            self.diag(original, name, "info", "world size 1: the JAX script is one program "
                      "over every device; its batch size is the global batch, sharded along "
                      "the data axis")
            return cst.Integer("1")
        if name in ("torch.distributed.is_initialized", "torch.distributed.is_available"):
            return cst.Name("True")
        if name in dt.WRAPPERS:
            module = updated.args[0].value if updated.args else None
            if module is None:
                raise Untranslatable(f"{name} without a module", rule=name)
            self.diag(original, name, "info", "DistributedDataParallel removed: the batch is "
                      "sharded over the devices and XLA inserts the gradient all-reduce")
            return module
        if name in dt.GENERATORS and (self._seeds_a_split(original) or self._consumed_generator(
                self._generator_variable(original))
                or id(original) in self.data.numpy_generators.ctors):
            return updated  # torch.Generator().manual_seed(s): the split or loader reads s
        if name in dt.TENSOR_DATASETS:
            self.need("grain")
            return dt.tensor_dataset(updated)
        if name in dt.RANDOM_SPLITS:
            self.need("grain")
            return dt.random_split(updated, self.data)
        if name in dt.SUBSETS:
            self.need("grain")
            return dt.subset(updated, self.data)
        if name in dt.LOADERS:
            target = self._assign_target(original)
            site = self.data.loaders.get(target or "")
            if site is not None and site.shuffled:
                return updated  # the assignment becomes a function of the epoch: leave_Assign
            expanded, warnings = dt.expand_loader_kwargs(original, updated, self.get_metadata)
            per_epoch = id(original) in self.data.epoch_loader_calls
            pipeline, notes = dt.loader_pipeline(original, expanded, self.q, self.data,
                                                 "epoch" if per_epoch else None)
            bound = self.data.loader_dicts.comp_calls.get(id(original))
            if bound is not None:  # an item of a dict of loaders (passes/loader_dicts.py)
                pipeline = ld.epoch_lambda(pipeline, bound)
            elif per_epoch:  # returned to a caller that names it (passes/returned_loaders.py)
                pipeline = cst.Lambda(cst.Parameters([cst.Param(cst.Name("epoch"))]), pipeline)
            for note in notes:
                self.diag(original, name, "info", note)
            for note in warnings:
                self.diag(original, name, "warning", note)
            self.need("grain", *(["np"] if self.data.drawn_seed else []))
            return pipeline
        if name in dt.SAMPLERS | dt.BATCH_SAMPLERS or name in dt.SCALERS or (
                name in dt.AUTOCASTS) or name in dt.DIST_GATHERS or (
                name in dt.DIST_DROPPED or name == dt.DIST_INIT) or (
                name in dt.DEVICE_DROPPED and isinstance(
                    self.get_metadata(ParentNodeProvider, original, None), cst.Expr)):
            return updated  # statements, arguments and with blocks: handled there
        return None

    def _seeds_a_split(self, node: cst.Call) -> bool:
        chain = [node]
        for _ in range(4):  # Call <- Attribute <- Call(manual_seed) <- Arg <- random_split
            chain.append(self.get_metadata(ParentNodeProvider, chain[-1], None))
        attr, _seeded, argument, split = chain[1:]
        return (isinstance(attr, cst.Attribute) and attr.attr.value == "manual_seed"
                and isinstance(argument, cst.Arg) and isinstance(split, cst.Call)
                and (self.q(split.func) or "") in dt.RANDOM_SPLITS | dt.LOADERS)

    def _generator_variable(self, node: cst.Call) -> str:
        """``g`` of ``g = torch.Generator()`` or ``g = torch.Generator().manual_seed(s)``."""
        seeded = self.get_metadata(ParentNodeProvider, node, None)
        if isinstance(seeded, cst.Attribute) and seeded.attr.value == "manual_seed":
            node = self.get_metadata(ParentNodeProvider, seeded, node)
        return self._assign_target(node) or ""

    def _consumed_generator(self, name: str) -> bool:
        """A torch.Generator variable read only as the generator= of loaders and splits."""
        return (name in self.data.generators and name not in self.data.generators_kept
                and self.data.generators[name] is not None)


def _dataset_bound_once(loader: cst.Call, fresh: str) -> tuple[cst.Call, cst.SimpleStatementLine | None]:
    """A per-epoch loader function reads its dataset each time it is called: a dataset built
    by a call (``DataLoader(make_data(n, key=subkey), ...)``) is bound to a fresh name where
    the loader was built, so it is built once, from the names (keys) as they were there."""
    for i, arg in enumerate(loader.args):
        if (arg.keyword is None and not arg.star and i == 0) or (
                arg.keyword is not None and arg.keyword.value == "dataset"):
            if not isinstance(arg.value, cst.Call):
                return loader, None
            line = cst.SimpleStatementLine([cst.Assign(
                [cst.AssignTarget(cst.Name(fresh))], arg.value)])
            args = list(loader.args)
            args[i] = arg.with_changes(value=cst.Name(fresh))
            return loader.with_changes(args=args), line
    return loader, None
