"""Data pipelines, data parallelism and mixed precision in training scripts.

* ``torch.utils.data``: map-style ``Dataset`` classes stay plain classes (``__len__`` and
  ``__getitem__`` are what grain's ``MapDataset.source`` reads); ``DataLoader`` becomes a grain
  ``MapDataset`` pipeline (``source -> shuffle(seed) -> batch(batch_size, drop_remainder)``).
  A loader that reshuffles every epoch becomes a function of the epoch, ``loader(epoch)``,
  whose shuffle seed is the script's seed plus the epoch (``DistributedSampler``'s own rule,
  ``seed + epoch``), so the order is new every epoch and the same on every run.
* ``torch.distributed`` + ``DistributedDataParallel``: the script becomes one program. It
  behaves as the torch script launched with a world of one process, with every batch sharded
  over the devices along a ``"data"`` mesh axis and the parameters replicated, so XLA inserts
  the gradient all-reduce DDP did. The rank is ``jax.process_index()``; the world size is 1:
  ``BATCH_SIZE`` is now the global batch, and the collectives of a world of one
  (``all_reduce``, ``barrier``, ``broadcast``) are identities and are dropped. Results do not
  depend on the number of devices.
* ``torch.autocast`` + ``GradScaler``: an explicit dtype policy. Inside the autocast region
  the model computes in bfloat16 (``model.set_attributes(dtype=jnp.bfloat16)``: flax layers'
  computation dtype, with float32 parameters, optimizer state and normalisation statistics) and
  its outputs are cast back to float32 for the loss. bfloat16 has float32's exponent range, so
  no loss scaling is needed: the GradScaler calls become the plain ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from torch2jax.analysis.host import HostDraws
from torch2jax.analysis.host_generators import NumpyGenerators
from torch2jax.analysis.index import qualified
from torch2jax.analysis.metadata import ParentNodeProvider
from torch2jax.analysis.training import RANDOM
from torch2jax.analysis.walk import NoAttributeHooks, of_type
from torch2jax.passes import loader_dicts, returned_loaders
from torch2jax.passes.common import Untranslatable, arg, bind, code, expr, try_literal

DATASET_BASES = {"torch.utils.data.Dataset", "torch.utils.data.dataset.Dataset"}
ITERABLE_BASES = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
LOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
TENSOR_DATASETS = {"torch.utils.data.TensorDataset", "torch.utils.data.dataset.TensorDataset"}
RANDOM_SPLITS = {"torch.utils.data.random_split", "torch.utils.data.dataset.random_split"}
SUBSETS = {"torch.utils.data.Subset", "torch.utils.data.dataset.Subset"}
DIST_SAMPLERS = {"torch.utils.data.DistributedSampler",
                 "torch.utils.data.distributed.DistributedSampler"}
RANDOM_SAMPLERS = {"torch.utils.data.RandomSampler", "torch.utils.data.sampler.RandomSampler"}
SEQ_SAMPLERS = {"torch.utils.data.SequentialSampler",
                "torch.utils.data.sampler.SequentialSampler"}
SAMPLERS = DIST_SAMPLERS | RANDOM_SAMPLERS | SEQ_SAMPLERS
BATCH_SAMPLERS = {"torch.utils.data.BatchSampler", "torch.utils.data.sampler.BatchSampler"}
GENERATORS = {"torch.Generator", "torch._C.Generator"}
WRAPPERS = {"torch.nn.parallel.DistributedDataParallel",
            "torch.nn.parallel.distributed.DistributedDataParallel",
            "torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
            "torch.nn.parallel.data_parallel.DataParallel"}
SCALERS = {"torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler",
           "torch.cuda.amp.GradScaler", "torch.cpu.amp.GradScaler"}
AUTOCASTS = {"torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast",
             "torch.cuda.amp.autocast", "torch.cpu.amp.autocast"}
# collectives and group management of a world of one process: identities
DIST_DROPPED = {"torch.distributed.barrier", "torch.distributed.all_reduce",
                "torch.distributed.broadcast", "torch.distributed.destroy_process_group",
                "torch.distributed.reduce"}
DIST_INIT = "torch.distributed.init_process_group"
# a process's current GPU (DDP: one process per GPU): JAX puts arrays on the default device
DEVICE_DROPPED = {"torch.cuda.set_device"}
# a world of one process gathers one value: the output list (or tensor) receives it
DIST_GATHERS = {"torch.distributed.all_gather", "torch.distributed.all_gather_object",
                "torch.distributed.all_gather_into_tensor"}
LOADER_DROPPED = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
                  "timeout", "worker_init_fn", "multiprocessing_context", "pin_memory_device",
                  "in_order")
# torchvision.transforms classes written into the converted file as numpy classes of the same
# name and arguments (passes/helpers.py); the random ones take a seeded numpy Generator
TRANSFORMS = {"Compose", "ToTensor", "Normalize", "Lambda", "CenterCrop", "Pad",
              "RandomHorizontalFlip", "RandomVerticalFlip", "RandomCrop"}
RANDOM_TRANSFORMS = {"RandomHorizontalFlip", "RandomVerticalFlip", "RandomCrop"}
TRANSFORM_MODULES = ("torchvision.transforms.", "torchvision.transforms.transforms.")


def transform_name(q: str) -> str | None:
    """``torchvision.transforms.ToTensor`` -> ``ToTensor`` (None: not a transforms name)."""
    for prefix in TRANSFORM_MODULES[::-1]:
        if q.startswith(prefix):
            return q[len(prefix):]
    return None


MESH = ("mesh = jax.make_mesh((jax.device_count(),), (\"data\",), axis_types=(AxisType.Auto,))\n"
        "data_sharding = NamedSharding(mesh, P(\"data\"))  # batches: split along the batch axis\n")


@dataclass
class SamplerSite:
    kind: str  # "distributed", "random", "sequential", "replacement"
    shuffle: bool
    seed: cst.BaseExpression | None
    # RandomSampler(num_samples=...): the number of indices it draws (None: len(dataset))
    num_samples: cst.BaseExpression | None = None


@dataclass
class BatchSamplerSite:
    sampler: SamplerSite
    batch_size: cst.BaseExpression
    drop_last: cst.BaseExpression | None


@dataclass
class LoaderSite:
    name: str
    shuffled: bool
    dataset: cst.BaseExpression | None = None  # its first argument


@dataclass
class DataIndex:
    samplers: dict[str, SamplerSite] = field(default_factory=dict)  # variable -> sampler
    loaders: dict[str, LoaderSite] = field(default_factory=dict)  # variable -> loader
    # shuffled DataLoader calls a function returns to callers that bind them to names
    # (passes/returned_loaders.py): written as functions of the epoch
    epoch_loader_calls: set[int] = field(default_factory=set)
    # dicts of loaders keyed by phase, one shuffled (passes/loader_dicts.py)
    loader_dicts: loader_dicts.LoaderDicts = field(default_factory=loader_dicts.LoaderDicts)
    wrapped: set[str] = field(default_factory=set)  # variables holding a DDP(...) model
    scalers: set[str] = field(default_factory=set)  # GradScaler variables
    tensor_datasets: set[str] = field(default_factory=set)  # names holding a grain MapDataset
    distributed: bool = False  # the script uses torch.distributed or DDP
    seed: cst.BaseExpression | None = None  # torch.manual_seed's argument
    model_classes: dict[str, str] = field(default_factory=dict)  # variable -> its module class
    # module classes that keep a constructor argument of unknown type as a plain attribute
    # (self.config = config): it becomes a static attribute of the NNX graph, which may not
    # be hashable, so a jax.jit function cannot take the graph's definition as a static arg
    opaque_static: set[str] = field(default_factory=set)
    # those classes' constructor parameters kept as attributes: a class whose every such
    # argument is known to be a scalar at its call sites (the value analysis) is not opaque
    opaque_params: dict[str, list[cst.Param]] = field(default_factory=dict)
    # random draws that only index the input pipeline: numpy on the host (analysis/host.py)
    host: HostDraws = field(default_factory=lambda: HostDraws(set(), None, None))
    shard: str = "data"  # "params": the model and optimizer state are split over the devices
    aliasing: bool = False  # a module class assigns self.a = self.b (a shared Variable)
    batch_samplers: dict[str, BatchSamplerSite] = field(default_factory=dict)
    iterable_classes: set[str] = field(default_factory=set)  # IterableDataset subclasses
    iterable_datasets: set[str] = field(default_factory=set)  # variables holding one
    # torch.Generator variables -> their manual_seed argument (None: never seeded)
    generators: dict[str, cst.BaseExpression | None] = field(default_factory=dict)
    # generator variables read anywhere but generator= of a loader or random_split, and
    # manual_seed statements: they must stay (and stay marked)
    generators_kept: set[str] = field(default_factory=set)
    # generator variables read as generator= of random draws (torch.randn(..., generator=g)):
    # they become keys, g = jax.random.key(s), split at every draw
    draw_generators: set[str] = field(default_factory=set)
    generator_draws: dict[int, str] = field(default_factory=dict)  # draw call id -> generator
    # generators passed around as objects: numpy Generators (analysis/host_generators.py)
    numpy_generators: NumpyGenerators = field(default_factory=NumpyGenerators)
    # every torchvision.transforms name the file reads has a numpy counterpart: its imports go
    transforms_translated: bool = True
    random_transforms: int = 0  # random transforms built so far (each gets its own stream)
    # the file builds random transforms: its loaders read in one thread, so that every run
    # hands the transforms' draws to the same elements (grain reads with 16 threads)
    random_augment: bool = False
    # a loader of the file is not a batched grain MapDataset over its whole dataset (no batch
    # size, an IterableDataset): len(loader.dataset) cannot be read off its pipeline
    unbatched_loader: bool = False
    # the program (this file or another, repo.py's HOST_DRAWS) draws from torch's global
    # generator in a Dataset: numpy's global generator on the host (passes/host_data.py),
    # which every torch.manual_seed's translation then seeds too
    global_host_draws: bool = False
    torch_seeded: bool = False  # some file of the program seeds torch (repo.py's TORCH_SEEDED)
    # numpy's global generator is seeded by every torch.manual_seed of the program
    # (repo.py's numpy_seeded): a loader of a file that does not seed draws its seed there
    numpy_seeded: bool = False
    # the file's torch seed is a seeding helper's parameter, and the helper seeds numpy with
    # it too (DataIndexer._resolve_helper_seed)
    helper_seeds_numpy: bool = False
    drawn_seed: bool = False  # a loader of this file draws its seed from numpy (np import)

    def host_seed(self) -> cst.BaseExpression:
        """The seed of a loader's order: the file's ``torch.manual_seed`` argument; in a file
        that does not seed, of a program seeded elsewhere, a draw from numpy's global
        generator (which that seed seeds, as torch's sampler draws its seed from torch's
        global generator); else 0."""
        if self.seed is not None:
            return self.seed
        if self.torch_seeded and self.numpy_seeded or self.helper_seeds_numpy:
            self.drawn_seed = True
            return cst.parse_expression("np.random.randint(2**31)")
        return cst.Integer("0")

    def dataset_length_known(self) -> bool:
        """Every loader is ``<source>[.shuffle(...)].batch(...)``, so the number of examples,
        torch's ``len(loader.dataset)``, is ``len(loader.parents[0])``."""
        return not (self.unbatched_loader or self.random_augment or self.distributed
                    or self.global_host_draws)

    def seeded_draw(self, generator: str) -> bool:
        """A draw from ``generator``, a ``torch.Generator().manual_seed(s)`` read only by draws
        and loaders: it splits that generator's own key (passes/rewrite_data.py), so the function
        it is in needs no key for it."""
        return (generator in self.draw_generators and generator not in self.generators_kept
                and self.generators.get(generator) is not None)

    def own_key_draws(self) -> set[int]:
        """The draw calls (ids) that :meth:`seeded_draw` covers."""
        return {i for i, g in self.generator_draws.items() if self.seeded_draw(g)}

    def generator_seed(self, gen: cst.BaseExpression | None) -> cst.BaseExpression | None:
        """The seed of ``torch.Generator().manual_seed(s)`` or of a variable seeded once."""
        if isinstance(gen, cst.Name) and gen.value not in self.generators_kept:
            return self.generators.get(gen.value)
        return _generator_seed(gen)

    def functional_ok(self, model: str, module_classes: set[str],
                      scalar: Callable[[cst.Param], bool] | None = None) -> bool:
        """Whether ``model``'s graph definition can be a static argument of jax.jit.
        ``scalar``: whether a constructor parameter is known to receive a scalar (hashable)."""
        cls = self.model_classes.get(model)
        opaque = {c for c in self.opaque_static & module_classes if scalar is None or not all(
            scalar(p) for p in self.opaque_params.get(c, ()))}
        return cls in module_classes and not opaque


class DataIndexer(NoAttributeHooks, cst.CSTVisitor):
    """Finds the loaders, samplers, DDP-wrapped models and scalers of a script."""

    METADATA_DEPENDENCIES = (ScopeProvider, ParentNodeProvider)

    def __init__(self, module_classes: set[str] | frozenset[str] = frozenset()) -> None:
        super().__init__()
        self.index = DataIndex()
        self.module_classes = set(module_classes)
        self._consumed: set[int] = set()  # ids of Names read as generator= of a loader/split
        self._other_reads: dict[str, int] = {}
        self._seedings: dict[str, int] = {}
        self._seed_param: tuple[str, int, str] | None = None  # (helper, position, name)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._note_transform(node)

    def _note_transform(self, node: cst.CSTNode) -> None:
        name = transform_name(self.q(node) or "")
        if name and name.split(".")[0] not in TRANSFORMS:
            self.index.transforms_translated = False

    def visit_Name(self, node: cst.Name) -> None:
        self._note_transform(node)
        if node.value in self.index.generators and id(node) not in self._consumed:
            self._other_reads[node.value] = self._other_reads.get(node.value, 0) + 1

    def leave_Module(self, original_node: cst.Module) -> None:
        found = returned_loaders.find(original_node, lambda c: (self.q(c.func) or "") in (
            LOADERS) and self._shuffled(c))
        for name, call in found.bound.items():
            if name not in self.index.loaders:
                self.index.loaders[name] = LoaderSite(name, True, _loader_dataset(call))
        self.index.epoch_loader_calls = found.epoch_calls
        dicts = loader_dicts.find(original_node, lambda c: (self.q(c.func) or "") in LOADERS,
                                  self._shuffled, self.index.loaders)
        self.index.loader_dicts = dicts
        self.index.epoch_loader_calls |= set(dicts.comp_calls)
        if self._seed_param is not None:
            self._resolve_helper_seed(original_node)
        # a generator is consumed when its only other reads are its assignment and seeding
        for name, reads in self._other_reads.items():
            if reads > self._seedings.get(name, 0) + 1:
                self.index.generators_kept.add(name)

    def visit_Expr(self, node: cst.Expr) -> None:
        """``g.manual_seed(s)`` as a statement seeds a generator variable."""
        if m.matches(node.value, m.Call(func=m.Attribute(value=m.Name(),
                                                         attr=m.Name("manual_seed")))) \
                and node.value.args and node.value.func.value.value in self.index.generators:
            name = node.value.func.value.value
            self.index.generators[name] = node.value.args[0].value
            self._seedings[name] = self._seedings.get(name, 0) + 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if any((self.q(b.value) or "") in ITERABLE_BASES for b in node.bases):
            self.index.iterable_classes.add(node.name.value)
        if node.name.value not in self.module_classes:
            return
        for assign in _assignments(node):
            if len(assign.targets) == 1 and all(m.matches(e, m.Attribute()) and code(
                    e).startswith("self.") for e in (assign.targets[0].target, assign.value)):
                self.index.aliasing = True
        for stmt in node.body.body:
            kept = _kept_opaque_arguments(stmt) if (isinstance(stmt, cst.FunctionDef)
                                                   and stmt.name.value == "__init__") else []
            if kept:
                self.index.opaque_static.add(node.name.value)
                self.index.opaque_params[node.name.value] = kept

    def q(self, node: cst.CSTNode) -> str | None:
        return qualified(self, node)

    def _known_map_dataset(self, dataset: cst.BaseExpression | None) -> bool:
        """A dataset built inline by a map-style class of a library
        (``DataLoader(torch.utils.data.TensorDataset(x, y), ...)``, ``datasets.MNIST(...)``)."""
        if not isinstance(dataset, cst.Call):
            return False
        q = self.q(dataset.func) or ""
        return q in TENSOR_DATASETS or q.startswith("torchvision.datasets.")

    def visit_Call(self, node: cst.Call) -> None:
        q = self.q(node.func) or ""
        if transform_name(q) in RANDOM_TRANSFORMS:
            self.index.random_augment = True
        if q in LOADERS:
            try:
                full, _ = expand_loader_kwargs(node, node, self.get_metadata)
            except Untranslatable:
                full = node
            b = bind(full.args, ("dataset", "batch_size"))
            dataset = b.get("dataset")
            sampler = bind(full.args, ("dataset", "batch_size", "shuffle", "sampler")).get(
                "sampler")
            site = _known_sampler(sampler, sampler, self.q, self.index) if sampler else None
            if (b.get("batch_size") is not None and b.literal("batch_size", 1) is None
                    or not (_map_dataset_expr(dataset, self.index)
                            or self._known_map_dataset(dataset))
                    or site is not None and site.kind == "replacement"):
                self.index.unbatched_loader = True
        if q in LOADERS or q in RANDOM_SPLITS:
            for a in node.args:
                if (a.keyword and a.keyword.value == "generator"
                        or q in RANDOM_SPLITS and a is node.args[-1] and len(node.args) == 3
                        and not a.keyword) and isinstance(a.value, cst.Name):
                    self._consumed.add(id(a.value))
        if q in RANDOM:
            for a in node.args:
                if a.keyword and a.keyword.value == "generator" and isinstance(
                        a.value, cst.Name) and a.value.value in self.index.generators:
                    self._consumed.add(id(a.value))
                    self.index.draw_generators.add(a.value.value)
                    self.index.generator_draws[id(node)] = a.value.value
        if q.startswith("torch.distributed.") or q in WRAPPERS:
            self.index.distributed = True
        if q in ("torch.manual_seed", "torch.random.manual_seed") and node.args and (
                self.index.seed is None):
            self.index.seed = node.args[0].value
            self._seed_param = self._helper_parameter(node.args[0].value)

    def _helper_parameter(self, seed: cst.BaseExpression) -> tuple[str, int, str] | None:
        """``def set_seed(seed): torch.manual_seed(seed)``: the helper's name, and the
        position and name of the parameter the seed is, which a loader elsewhere cannot read."""
        if not isinstance(seed, cst.Name):
            return None
        scope = self.get_metadata(ScopeProvider, seed, None)
        if not isinstance(scope, cst.metadata.FunctionScope) or not isinstance(
                scope.node, cst.FunctionDef):
            return None
        params = list(scope.node.params.params)
        at = next((i for i, p in enumerate(params) if p.name.value == seed.value), None)
        return (scope.node.name.value, at, seed.value) if at is not None else None

    def _resolve_helper_seed(self, module: cst.Module) -> None:
        """The seed of a seeding helper's parameter, for the loaders: the literal every call
        of the helper passes; else, when the helper also seeds numpy with it, a draw from
        numpy's global generator (as torch's sampler draws its seed from torch's); else the
        parameter's name stays (the output invariant marks where it is read)."""
        fn, at, name = self._seed_param
        values = set()
        for c in m.findall(module, m.Call(func=m.Name(fn))):
            given = [a.value for a in c.args if a.keyword and a.keyword.value == name] or [
                a.value for a in c.args[at:at + 1] if not a.keyword and not a.star]
            values.add(try_literal(given[0], ...) if given else ...)
        if len(values) == 1 and isinstance(next(iter(values)), int):
            self.index.seed = cst.Integer(str(next(iter(values))))
            return
        if m.findall(module, m.FunctionDef(name=m.Name(fn), body=m.IndentedBlock(body=[
                m.ZeroOrMore(), m.SimpleStatementLine(body=[m.Expr(m.Call(
                    func=m.Attribute(value=m.Attribute(value=m.Name("np") | m.Name("numpy"),
                                                       attr=m.Name("random")),
                                     attr=m.Name("seed")),
                    args=[m.Arg(value=m.Name(name))]))]), m.ZeroOrMore()]))):
            self.index.seed = None
            self.index.helper_seeds_numpy = True

    def visit_Assign(self, node: cst.Assign) -> None:
        if (len(node.targets) == 1 and isinstance(node.targets[0].target, (cst.Tuple, cst.List))
                and isinstance(node.value, cst.Call)
                and (self.q(node.value.func) or "") in RANDOM_SPLITS):
            for e in node.targets[0].target.elements:
                if isinstance(e.value, cst.Name):
                    self.index.tensor_datasets.add(e.value.value)
            return
        if len(node.targets) != 1 or not isinstance(node.targets[0].target, cst.Name):
            return
        name = node.targets[0].target.value
        value = node.value
        if not isinstance(value, cst.Call):
            return
        q = self.q(value.func) or ""
        gen = value.func.value if m.matches(value.func, m.Attribute(attr=m.Name(
            "manual_seed"))) else value
        if isinstance(gen, cst.Call) and (self.q(gen.func) or "") in GENERATORS:
            self.index.generators[name] = value.args[0].value if gen is not value else None
            return
        built = value.args[0].value if q in WRAPPERS and value.args else value
        if isinstance(built, cst.Call) and isinstance(built.func, cst.Name):
            self.index.model_classes[name] = built.func.value
            if built.func.value in self.index.iterable_classes:
                self.index.iterable_datasets.add(name)
        if q in BATCH_SAMPLERS:
            site = self._batch_sampler(value)
            if site is not None:
                self.index.batch_samplers[name] = site
        elif q in SAMPLERS:
            self.index.samplers[name] = sampler_site(q, value)
        elif q in LOADERS:
            self.index.loaders[name] = LoaderSite(name, self._shuffled(value),
                                                  _loader_dataset(value))
        elif q in WRAPPERS:
            self.index.wrapped.add(name)
        elif q in SCALERS:
            self.index.scalers.add(name)
        elif q in TENSOR_DATASETS or q in SUBSETS:
            self.index.tensor_datasets.add(name)

    def _batch_sampler(self, call: cst.Call) -> BatchSamplerSite | None:
        return batch_sampler_site(call, self.q, self.index)

    def _shuffled(self, call: cst.Call) -> bool:
        try:
            call, _ = expand_loader_kwargs(call, call, self.get_metadata)
        except Untranslatable:
            pass  # marked where the loader is rewritten
        b = bind(call.args, ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler"))
        if b.literal("shuffle") not in (None, False):
            return True  # True, or known at run time (shuffle=is_train): it may shuffle
        batch_sampler = b.get("batch_sampler")
        if isinstance(batch_sampler, cst.Name) and batch_sampler.value in (
                self.index.batch_samplers):
            return self.index.batch_samplers[batch_sampler.value].sampler.shuffle
        if isinstance(batch_sampler, cst.Call):
            site = self._batch_sampler(batch_sampler)
            return site is not None and site.sampler.shuffle
        sampler = b.get("sampler")
        if isinstance(sampler, cst.Name) and sampler.value in self.index.samplers:
            return self.index.samplers[sampler.value].shuffle
        if isinstance(sampler, cst.Call):
            q = self.q(sampler.func) or ""
            if q in SAMPLERS:
                return sampler_site(q, sampler).shuffle
        return False


def _loader_dataset(call: cst.Call) -> cst.BaseExpression | None:
    """A ``DataLoader(...)`` call's dataset argument."""
    if call.args and call.args[0].keyword is None and not call.args[0].star:
        return call.args[0].value
    return next((a.value for a in call.args if a.keyword is not None
                 and a.keyword.value == "dataset"), None)


def _kept_opaque_arguments(init: cst.FunctionDef) -> list[cst.Param]:
    """The parameters ``arg`` of ``self.x = arg`` in ``__init__`` that have no literal default
    or scalar annotation: their type (a config dataclass, a list) is not known here. A
    ``None`` default says nothing of the type when an annotation names another one
    (``config: GPTConfig = None``: a dataclass, unhashable)."""
    scalar = {"int", "float", "str", "bool"}
    opaque = {}
    for p in [*init.params.params, *init.params.kwonly_params]:
        ann = code(p.annotation.annotation) if p.annotation else ""
        literal_default = isinstance(p.default, (cst.Integer, cst.Float, cst.SimpleString)) or (
            isinstance(p.default, cst.Name) and p.default.value in ("True", "False")) or (
            m.matches(p.default, m.Name("None")) and not (ann and ann.strip("'\"").replace(
                "Optional[", "").rstrip("]").split(" | ")[0] not in scalar))
        if p.name.value != "self" and ann not in scalar and not literal_default:
            opaque[p.name.value] = p
    kept = []
    for assign in _assignments(init):
        if (len(assign.targets) == 1 and m.matches(assign.targets[0].target, m.Attribute(
                value=m.Name("self"))) and isinstance(assign.value, cst.Name)
                and assign.value.value in opaque and opaque[assign.value.value] not in kept):
            kept.append(opaque[assign.value.value])
    return kept


def _assignments(node: cst.CSTNode) -> list[cst.Assign]:
    return of_type(node, cst.Assign)


def sampler_site(q: str, node: cst.Call) -> SamplerSite:
    if q in DIST_SAMPLERS:
        b = bind(node.args, ("dataset", "num_replicas", "rank", "shuffle", "seed", "drop_last"))
        shuffle = b.literal("shuffle")
        return SamplerSite("distributed", shuffle is not False, b.get("seed"))
    if q in RANDOM_SAMPLERS:
        b = bind(node.args, ("data_source", "replacement", "num_samples", "generator"))
        if b.literal("replacement") is True:
            return SamplerSite("replacement", False, None, b.get("num_samples"))
        return SamplerSite("random", True, None, b.get("num_samples"))
    return SamplerSite("sequential", False, None)


def transform(name: str, node: cst.Call, data: DataIndex) -> cst.Call:
    """``transforms.RandomCrop(32, padding=4)`` -> ``RandomCrop(32, padding=4, rng=...)``:
    the numpy class of the same name, a random one with its own seeded stream."""
    call = node.with_changes(func=cst.Name(name))
    if name not in RANDOM_TRANSFORMS:
        return call
    data.random_transforms += 1
    seed = code(data.seed) if data.seed is not None else "0"
    rng = expr(f"np.random.default_rng([{seed}, {data.random_transforms}])")
    args = list(call.args)
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return call.with_changes(args=[*args, arg(rng, "rng")])


def batch_sampler_site(call: cst.Call, q_of, data: DataIndex) -> BatchSamplerSite | None:
    """``BatchSampler(sampler, batch_size, drop_last)`` over a translated sampler."""
    b = bind(call.args, ("sampler", "batch_size", "drop_last"))
    sampler, batch_size = b.get("sampler"), b.get("batch_size")
    if batch_size is None:
        return None
    site = _known_sampler(sampler, sampler, q_of, data)
    return None if site is None else BatchSamplerSite(site, batch_size, b.get("drop_last"))


def _known_sampler(original: cst.BaseExpression | None, sampler: cst.BaseExpression | None,
                   q_of, data: DataIndex) -> SamplerSite | None:
    """A sampler variable of the script, or a translated sampler built in place (``original``
    is that argument in the source tree, where ``q_of`` names it)."""
    if isinstance(sampler, cst.Name):
        return data.samplers.get(sampler.value)
    if isinstance(original, cst.Call) and (q_of(original.func) or "") in SAMPLERS:
        return sampler_site(q_of(original.func), sampler)
    return None


def expand_loader_kwargs(original: cst.Call, node: cst.Call, get
                         ) -> tuple[cst.Call, list[str]]:
    """``DataLoader(ds, **train_kwargs)`` with ``train_kwargs = {'batch_size': ...}``: ``node``
    (the rewritten call) with the dict's items as keyword arguments, and notes. An update
    of the dict (``train_kwargs.update(cuda_kwargs)``) is followed when it always runs; one
    under a condition that adds options the pipeline does not drop anyway is reported.
    Raises Untranslatable when the dict is not a literal the file shows. ``get`` is a
    visitor's get_metadata (scopes and parents of ``original``'s tree)."""
    if not any(a.star == "**" for a in original.args):
        return node, []
    notes: list[str] = []
    args = []
    for o, a in zip(original.args, node.args, strict=True):
        if a.star != "**":
            args.append(a)
            continue
        if not isinstance(o.value, cst.Name):
            raise Untranslatable(f"DataLoader(**{code(o.value)}): the options are not a dict "
                                 "the file shows", rule="torch.utils.data.DataLoader")
        items = _dict_literal(o.value, get, notes)
        args.extend(arg(value, key) for key, value in items.items())
    given = [a.keyword.value for a in args if a.keyword is not None]
    if len(given) != len(set(given)):
        raise Untranslatable("DataLoader: an option given twice (in **kwargs and by name)",
                             rule="torch.utils.data.DataLoader")
    if args:
        args[-1] = args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return node.with_changes(args=args), notes


def _dict_literal(name: cst.Name, get, notes: list[str]) -> dict[str, cst.BaseExpression]:
    """The items of the dict literal ``name`` holds where it is read, with the updates that
    always run merged in."""
    problem = Untranslatable(f"DataLoader(**{name.value}): {name.value} is not one dict literal "
                             "(or dict(...) call) of this file with constant keys: the loader's "
                             "options cannot be read", rule="torch.utils.data.DataLoader")
    scope = get(ScopeProvider, name, None)
    access = next((a for a in scope.accesses[name] if a.node is name), None) if scope else None
    referents = list(access.referents) if access is not None else []
    if len(referents) != 1:
        raise problem
    binding = referents[0]
    target = getattr(binding, "node", None)
    assign = get(ParentNodeProvider, get(ParentNodeProvider, target, None), None) \
        if target is not None else None
    if not isinstance(assign, cst.Assign) or len(assign.targets) != 1:
        raise problem
    items = _items_of(assign.value)
    if items is None:
        raise problem
    home = _block_of(assign, get)
    for ref in binding.references:
        if ref.node is name:
            continue
        parent = get(ParentNodeProvider, ref.node, None)
        call = get(ParentNodeProvider, parent, None) if isinstance(parent, cst.Attribute) \
            else None
        if isinstance(parent, cst.Attribute) and parent.attr.value == "update" and isinstance(
                call, cst.Call) and len(call.args) == 1 and not call.args[0].keyword:
            other = call.args[0].value
            added = _items_of(other) if not isinstance(other, cst.Name) else \
                _dict_literal(other, get, notes)
            if added is None:
                raise problem
            if _block_of(call, get) is home:
                items.update(added)
                continue
            kept = [k for k in added if k not in LOADER_DROPPED]
            if kept:
                notes.append(f"{name.value}.update(...) under a condition is not followed: "
                             f"{', '.join(f'{k}={code(added[k])}' for k in kept)} applies only "
                             "where it runs in the torch script; the pipeline uses "
                             f"{name.value} as written")
            continue
        if isinstance(parent, cst.Subscript) or isinstance(parent, cst.Attribute) and (
                parent.attr.value not in ("get", "items", "keys", "values", "copy")):
            raise problem  # changed some other way
    return items


def _items_of(node: cst.BaseExpression) -> dict[str, cst.BaseExpression] | None:
    """``{'a': x}`` / ``dict(a=x)`` with constant keys -> their items. A conditional expression
    of two of them (``{'num_workers': 1, 'pin_memory': True} if use_cuda else {}``) whose
    branches differ only in options the pipeline drops has the items of both."""
    if isinstance(node, cst.IfExp):
        body, orelse = _items_of(node.body), _items_of(node.orelse)
        if body is None or orelse is None:
            return None
        for key in {*body, *orelse} - set(LOADER_DROPPED):
            if key not in body or key not in orelse or code(body[key]) != code(orelse[key]):
                return None
        return {**orelse, **body}
    if isinstance(node, cst.Dict):
        out = {}
        for e in node.elements:
            if not isinstance(e, cst.DictElement) or not isinstance(e.key, cst.SimpleString):
                return None
            out[e.key.evaluated_value] = e.value
        return out
    if m.matches(node, m.Call(func=m.Name("dict"))) and all(
            a.keyword is not None and not a.star for a in node.args):
        return {a.keyword.value: a.value for a in node.args}
    return None


def _block_of(node: cst.CSTNode, get) -> cst.CSTNode | None:
    """The function body (or module) ``node`` runs in unconditionally: None inside an if,
    loop or try of it."""
    at = get(ParentNodeProvider, node, None)
    while at is not None:
        if isinstance(at, (cst.If, cst.For, cst.While, cst.Try, cst.With)):
            return None
        if isinstance(at, (cst.FunctionDef, cst.Module)):
            return at
        at = get(ParentNodeProvider, at, None)
    return None


def loader_pipeline(original: cst.Call, node: cst.Call, q_of, data: DataIndex,
                    epoch: str | None) -> tuple[cst.BaseExpression, list[str]]:
    """``DataLoader(...)`` -> a grain pipeline expression, and notes for the report.

    ``original`` is the call in the source tree (``q_of`` gives qualified names there),
    ``node`` the rewritten one; ``epoch`` names the parameter the shuffle seed adds (None: the
    loader is not shuffled)."""
    params = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers",
              "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
              "multiprocessing_context", "generator")
    b = bind(node.args, params)
    ob = bind(original.args, params)
    notes: list[str] = []
    dataset = b.get("dataset")
    if dataset is None:
        raise Untranslatable("DataLoader without a dataset", rule="torch.utils.data.DataLoader")
    dropped = [a.keyword.value for a in node.args
               if a.keyword and a.keyword.value in LOADER_DROPPED]
    if dropped:
        notes.append(f"DataLoader({', '.join(dropped)}) dropped: the grain MapDataset reads in "
                     "this process; .to_iter_dataset(grain.ReadOptions(num_threads=...)) "
                     "reads in parallel")
    batch_size, drop_last = b.get("batch_size"), b.get("drop_last")
    if batch_size is None and not any(a.keyword and a.keyword.value == "batch_size"
                                      for a in node.args):
        batch_size = cst.Integer("1")
    site: SamplerSite | None = None
    if b.get("batch_sampler") is not None:
        batch_site = _batch_sampler_of(ob.get("batch_sampler"), b.get("batch_sampler"), q_of,
                                       data)
        site, batch_size, drop_last = batch_site.sampler, batch_site.batch_size, \
            batch_site.drop_last
    else:
        site = _sampler_of(ob.get("sampler"), b.get("sampler"), q_of, data)
    if _iterable(dataset, data):
        if site is not None or epoch is not None:
            raise Untranslatable("DataLoader over an IterableDataset with a sampler or "
                                 "shuffle=True (torch refuses it too)",
                                 rule="torch.utils.data.DataLoader")
        args = [code(dataset), code(batch_size)]
        if drop_last is not None and try_literal(drop_last, None) is not False:
            args.append(f"drop_last={code(drop_last)}")
        if b.get("collate_fn") is not None:
            args.append(f"collate_fn={code(b.get('collate_fn'))}")
        return expr(f"IterableLoader({', '.join(args)})"), notes
    pipeline = _source(dataset, data)
    if site is not None and site.kind == "random" and site.num_samples is not None:
        raise Untranslatable("RandomSampler(num_samples=...) without replacement (torch "
                             "concatenates permutations to reach the count)",
                             rule="torch.utils.data.DataLoader")
    if site is not None and site.kind == "replacement":
        if not isinstance(dataset, (cst.Name, cst.Attribute)):
            raise Untranslatable("RandomSampler(replacement=True) over a dataset expression: "
                                 "assign it to a name first", rule="torch.utils.data.DataLoader")
        count = site.num_samples if site.num_samples is not None else expr(
            "len({d})", d=dataset)
        seed = data.host_seed()
        pipeline = (f"grain.MapDataset.range({code(count)}).random_map(lambda _, rng: "
                    f"{code(dataset)}[rng.integers(len({code(dataset)}))], seed={code(seed)})")
        notes.append(f"RandomSampler(replacement=True): every example an independent uniform "
                     f"draw from a numpy Generator seeded with {code(seed)} (torch drew them "
                     "from its global generator)")
    shuffle = b.get("shuffle")
    flag = try_literal(shuffle, ...) if shuffle is not None else False
    if epoch is None and (flag not in (None, False) or site is not None and site.shuffle):
        # (only a loader assigned to a name becomes a function of the epoch: rewrite_data.py)
        raise Untranslatable("a shuffled DataLoader that is not assigned to a name (returned "
                             "by a function, built in place, stored in a container): torch "
                             "draws a new order at every epoch, which a grain pipeline gets "
                             "from a seed per epoch; assign the loader to a name in the "
                             "function that loops over it", rule="torch.utils.data.DataLoader")
    if epoch is not None:
        shuffled = pipeline + (f".shuffle(seed="
                               f"{code(_shuffle_seed(site, b.get('generator'), data, notes))}"
                               f" + {epoch})")
        # shuffle=is_train: shuffled where the flag is true when the pipeline is built
        pipeline = f"({shuffled} if {code(shuffle)} else {pipeline})" if (
            shuffle is not None and flag is ...) else shuffled
    if batch_size is not None and not m.matches(batch_size, m.Name("None")):
        args = [code(batch_size)]
        if try_literal(drop_last, None) is True:
            args.append("drop_remainder=True")
        elif drop_last is not None and try_literal(drop_last, None) is not False:
            args.append(f"drop_remainder={code(drop_last)}")
        collate = b.get("collate_fn")
        if collate is not None:
            args.append(f"batch_fn={code(collate)}")
        pipeline += f".batch({', '.join(args)})"
    if data.global_host_draws:
        pipeline += ".to_iter_dataset(grain.ReadOptions(num_threads=0))"
        notes.append("read in the calling thread (num_threads=0), as torch's DataLoader without "
                     "workers reads: a dataset of the program draws from numpy's global "
                     "generator, to which grain's reading threads would hand the elements in "
                     "a different order on every run")
    elif data.random_augment:
        pipeline += ".to_iter_dataset(grain.ReadOptions(num_threads=1))"
        notes.append("read in one thread: the file's random transforms draw from seeded numpy "
                     "Generators, and grain's default 16 threads would hand the draws to "
                     "elements in a different order on every run")
    return expr(pipeline), notes


def read_by_iterator(site: LoaderSite, data: DataIndex) -> bool:
    """Whether the loader's pipeline ends in ``.to_iter_dataset(...)`` (loader_pipeline),
    which has no ``len``: its batches are counted on the MapDataset it reads,
    ``loader.parents[0]``."""
    return (data.global_host_draws or data.random_augment) and site.dataset is not None and \
        not _iterable(site.dataset, data)


def _iterable(dataset: cst.BaseExpression, data: DataIndex) -> bool:
    """Whether a loader's dataset is an IterableDataset (a variable holding one, or built)."""
    if isinstance(dataset, cst.Name):
        return dataset.value in data.iterable_datasets
    return m.matches(dataset, m.Call(func=m.Name())) and dataset.func.value in (
        data.iterable_classes)


def _sampler_of(original: cst.BaseExpression | None, sampler: cst.BaseExpression | None,
                q_of, data: DataIndex) -> SamplerSite | None:
    if sampler is None:
        return None
    site = _known_sampler(original, sampler, q_of, data)
    if site is None:
        raise Untranslatable("DataLoader(sampler=...) with a sampler that is not translated "
                             "(DistributedSampler, RandomSampler and SequentialSampler are)",
                             rule="torch.utils.data.DataLoader")
    return site


def _batch_sampler_of(original: cst.BaseExpression | None, batch_sampler: cst.BaseExpression,
                      q_of, data: DataIndex) -> BatchSamplerSite:
    site = None
    if isinstance(batch_sampler, cst.Name):
        site = data.batch_samplers.get(batch_sampler.value)
    elif isinstance(original, cst.Call) and (q_of(original.func) or "") in BATCH_SAMPLERS:
        site = batch_sampler_site(original, q_of, data)
    if site is None:
        raise Untranslatable("DataLoader(batch_sampler=...) other than a BatchSampler over a "
                             "translated sampler", rule="torch.utils.data.DataLoader")
    return site


def _shuffle_seed(site: SamplerSite | None, generator: cst.BaseExpression | None,
                  data: DataIndex, notes: list[str]) -> cst.BaseExpression:
    """The seed a shuffled loader's order comes from (the epoch is added to it)."""
    if site is not None and site.kind == "distributed":
        return site.seed if site.seed is not None else cst.Integer("0")
    if generator is not None:
        seed = data.generator_seed(generator)
        if seed is None:
            raise Untranslatable(
                "DataLoader(generator=...) with a generator that is also read elsewhere (its "
                "draws are shared)" if isinstance(generator, cst.Name)
                and generator.value in data.generators_kept else
                "DataLoader(generator=...) with a generator that is not seeded with "
                "manual_seed", rule="torch.Generator")
        return seed
    base = data.host_seed()
    notes.append(f"DataLoader(shuffle=True): shuffled with seed {code(base)} + epoch "
                 "(torch drew the order from its global generator)")
    return base


def host_arrays(init: cst.FunctionDef) -> cst.FunctionDef:
    """A Dataset's ``__init__``: ``self.x = value`` -> ``self.x = jax.device_get(value)``.

    grain reads a dataset one element at a time on the host; JAX arrays would be indexed on
    the device element by element and copied back for every batch. ``jax.device_get`` turns
    JAX arrays (also inside tuples and lists) into numpy arrays and leaves anything else (file
    names, transforms) as it is."""
    body = []
    for stmt in init.body.body:
        if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1
                and m.matches(stmt.body[0].targets[0].target,
                              m.Attribute(value=m.Name("self")))
                and not isinstance(stmt.body[0].value, (cst.SimpleString, cst.Integer,
                                                        cst.Float, cst.FormattedString))):
            a = stmt.body[0]
            stmt = stmt.with_changes(body=[a.with_changes(value=cst.Call(
                func=expr("jax.device_get"), args=[cst.Arg(a.value)]))])
        body.append(stmt)
    return init.with_changes(body=init.body.with_changes(body=body))


def tensor_dataset(node: cst.Call) -> cst.BaseExpression:
    """``TensorDataset(a, b)`` -> a grain MapDataset over the rows ``(a[i], b[i])`` on the
    host: ``jax.device_get`` copies the arrays to numpy once (each argument is evaluated
    once, as torch's are), and ``zip`` pairs their rows, so an element is numpy views, not a
    device gather per element (issue 30)."""
    tensors = [a.value for a in node.args if a.keyword is None and not a.star]
    if not tensors or len(tensors) != len(node.args):
        raise Untranslatable("TensorDataset with starred or keyword arguments",
                             rule="torch.utils.data.TensorDataset")
    items = ", ".join(code(t) for t in tensors) + ("," if len(tensors) == 1 else "")
    return expr(f"grain.MapDataset.source(list(zip(*jax.device_get(({items})))))")


def _source(dataset: cst.BaseExpression, data: DataIndex) -> str:
    if isinstance(dataset, cst.Name) and dataset.value in data.tensor_datasets:
        return code(dataset)  # already a MapDataset
    if m.matches(dataset, m.Call(func=m.Attribute(value=m.Attribute(
            value=m.Name("grain"), attr=m.Name("MapDataset"))))):
        return code(dataset)  # DataLoader(TensorDataset(x, y)): already a MapDataset
    return f"grain.MapDataset.source({code(dataset)})"


def random_split(node: cst.Call, data: DataIndex) -> cst.BaseExpression:
    """``random_split(ds, [a, b], generator=g)`` -> disjoint slices of one seeded permutation:
    ``(base.shuffle(seed=s)[0:a], base.shuffle(seed=s)[a:a + b])``."""
    b = bind(node.args, ("dataset", "lengths", "generator"))
    dataset, lengths = b.get("dataset"), b.get("lengths")
    if dataset is None or not isinstance(lengths, (cst.List, cst.Tuple)):
        raise Untranslatable("random_split with lengths that are not a list",
                             rule="torch.utils.data.random_split")
    parts = [e.value for e in lengths.elements]
    seed = data.generator_seed(b.get("generator"))
    if seed is None:  # (read twice below: never a draw)
        seed = data.seed if data.seed is not None else cst.Integer("0")
    base = f"{_source(dataset, data)}.shuffle(seed={code(seed)})"
    if any(isinstance(p, cst.Float) for p in parts):
        if not all(isinstance(p, cst.Float) for p in parts):
            raise Untranslatable("random_split mixing fractions and lengths",
                                 rule="torch.utils.data.random_split")
        # fractions: torch's lengths (floor, the remainder spread from the first), in a helper
        return expr(f"split_fractions({base}, {code(lengths)})")
    slices, start = [], "0"
    for part in parts:
        text = code(part) if isinstance(part, (cst.Name, cst.Integer, cst.Call, cst.Attribute)) \
            else f"({code(part)})"
        stop = code(part) if start == "0" else f"{start} + {text}"
        slices.append(f"{base}[{start}:{stop}]")
        start = stop
    return expr("(" + ", ".join(slices) + ("," if len(slices) == 1 else "") + ")")


def _generator_seed(gen: cst.BaseExpression | None) -> cst.BaseExpression | None:
    """``torch.Generator().manual_seed(s)`` -> ``s``."""
    if m.matches(gen, m.Call(func=m.Attribute(value=m.Call(), attr=m.Name("manual_seed")))) \
            and gen.args:
        return gen.args[0].value
    return None


def subset(node: cst.Call, data: DataIndex) -> cst.BaseExpression:
    """``Subset(ds, indices)`` -> a MapDataset of ``ds[indices[i]]``."""
    b = bind(node.args, ("dataset", "indices"))
    dataset, indices = b.get("dataset"), b.get("indices")
    if dataset is None or indices is None:
        raise Untranslatable("Subset without a dataset and indices",
                             rule="torch.utils.data.Subset")
    return expr(f"grain.MapDataset.range(len({code(indices)})).map("
                f"lambda i: {code(dataset)}[{code(indices)}[i]])")


def autocast_dtype(node: cst.Call, q: str, variable: bool = False) -> tuple[str, list[str]]:
    """The jnp dtype an autocast region computes in, and notes. ``variable``: a dtype held
    by a variable (``dtype=ptdtype``, chosen from a config string) is that variable's value,
    float16 computed in bfloat16 as below; the caller then also decides an ``enabled=``
    expression at run time (:func:`autocast_enabled`). Without it such an expression is
    refused: assuming the region on would be silently wrong."""
    b = bind(node.args, ("device_type", "dtype", "enabled") if q in (
        "torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")
        else ("enabled", "dtype"))
    enabled = b.literal("enabled", True)
    if enabled is False:
        return "", []
    if enabled is not True and not variable:  # on or off only at run time
        raise Untranslatable(f"autocast(enabled={code(b.get('enabled'))}): whether the region "
                             "is on is known only at run time; write enabled=True or False",
                             rule="torch.autocast")
    dtype = b.get("dtype")
    text = code(dtype) if dtype is not None else ""
    if variable and isinstance(dtype, cst.Name):
        return f"(jnp.bfloat16 if {text} == jnp.float16 else {text})", [
            (f"autocast(dtype={text}): computes in {text}, float16 in bfloat16 (float16 "
             "would need dynamic loss scaling, which is not emitted)")]
    device = b.literal("device_type")
    if "bfloat16" in text or (dtype is None and (device == "cpu" or q == "torch.cpu.amp.autocast")):
        return "jnp.bfloat16", []
    if dtype is None or "float16" in text or "half" in text:
        return "jnp.bfloat16", [("float16 autocast computes in bfloat16: float32's exponent "
                                "range, so no loss scaling is needed (float16 would need "
                                "dynamic loss scaling, which is not emitted)")]
    raise Untranslatable(f"autocast(dtype={text})", rule="torch.autocast")


def autocast_enabled(node: cst.Call, q: str) -> cst.BaseExpression | None:
    """``enabled=`` of an autocast call when it is an expression decided at run time
    (``enabled=(dtype == "bfloat16")``); None when absent or a literal."""
    b = bind(node.args, ("device_type", "dtype", "enabled") if q in (
        "torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast")
        else ("enabled", "dtype"))
    enabled = b.get("enabled")
    if enabled is None or b.literal("enabled", ...) is not ...:
        return None
    return enabled


def _is_model_call(node: cst.BaseExpression, models: set[str]) -> bool:
    return m.matches(node, m.Call(func=m.Name())) and node.func.value in models


def _cast_output(node: cst.BaseExpression) -> cst.BaseExpression:
    return cst.Call(func=cst.Attribute(value=node, attr=cst.Name("astype")),
                    args=[cst.Arg(expr("jnp.float32"))])


def cast_model_outputs(body: list[cst.BaseStatement], models: set[str], nested: bool = False
                       ) -> tuple[list[str], list[cst.BaseStatement]]:
    """The statements of an autocast region with each ``out = model(...)`` cast to float32
    (``out = model(...).astype(jnp.float32)``): torch runs the loss (and softmax, norms,
    reductions) of a low-precision output in float32. Returns the models called that way, in
    order, and the new statements. ``nested``: also a tuple of outputs
    (``logits, loss = model(X, Y)``, cast leaf by leaf) and a model call that is an argument
    of another call (``F.cross_entropy(model(x), y)``)."""
    called: list[str] = []
    new_body = []
    for stmt in body:
        if (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
                and isinstance(stmt.body[0], cst.Assign)
                and _is_model_call(stmt.body[0].value, models)):
            a = stmt.body[0]
            called.append(a.value.func.value)
            cast = _cast_outputs(a.value) if nested and len(a.targets) == 1 and not isinstance(
                a.targets[0].target, cst.Name) else _cast_output(a.value)
            stmt = stmt.with_changes(body=[a.with_changes(value=cast)])
        elif nested and isinstance(stmt, cst.SimpleStatementLine):
            # loss = F.cross_entropy(model(x), y): the output read where it is computed
            caster = _CastNested(models)
            stmt = stmt.visit(caster)
            called.extend(caster.called)
        new_body.append(stmt)
    return called, new_body


def _cast_outputs(node: cst.BaseExpression) -> cst.BaseExpression:
    return expr("jax.tree.map(lambda a: a.astype(jnp.float32), {v})", v=node)


class _CastNested(cst.CSTTransformer):
    """Model calls that are arguments of another call, cast to float32."""

    def __init__(self, models: set[str]) -> None:
        super().__init__()
        self.models = models
        self.called: list[str] = []

    def visit_Lambda(self, node) -> bool:
        return False

    def leave_Arg(self, original_node, updated_node):
        if _is_model_call(updated_node.value, self.models):
            self.called.append(updated_node.value.func.value)
            return updated_node.with_changes(value=_cast_output(updated_node.value))
        return updated_node


def set_dtype(model: str, dtype: str) -> cst.SimpleStatementLine:
    return cst.parse_statement(
        f"{model}.set_attributes(dtype={dtype}, raise_if_not_found=False)\n")


def distributed_init() -> cst.If:
    stmt = cst.parse_statement(
        "if \"JAX_COORDINATOR_ADDRESS\" in os.environ:  # several hosts: one process each\n"
        "    jax.distributed.initialize()\n")
    assert isinstance(stmt, cst.If)
    return stmt


def mesh_statements() -> list[cst.BaseStatement]:
    return list(cst.parse_module(MESH).body)


def shard_state(model: str, optimizer: str) -> list[cst.BaseStatement]:
    """--shard params: each array of the model and optimizer state split along its first axis
    over the data axis where that axis divides, replicated otherwise (FSDP-style); XLA gathers
    what each step needs."""
    return list(cst.parse_module(
        f"shard_state = nnx.state(({model}, {optimizer}))  # --shard params\n"
        "state_sharding = jax.tree.map(\n"
        "    lambda a: NamedSharding(mesh, P(\"data\") if a.ndim and a.shape[0] % mesh.size == 0"
        " else P()),\n"
        "    shard_state,\n"
        ")\n"
        f"nnx.update(({model}, {optimizer}), jax.device_put(shard_state, state_sharding))\n"
    ).body)


def replicate_state(model: str, optimizer: str) -> list[cst.BaseStatement]:
    """Data parallel: the model and optimizer state replicated over the mesh before the
    functional step's first call, as the step returns it; arrays left on one device would
    make the first call compile once more."""
    return list(cst.parse_module(
        f"nnx.update(({model}, {optimizer}), jax.device_put(  # replicated, as the step returns "
        f"it\n    nnx.state(({model}, {optimizer})), NamedSharding(mesh, P())))\n").body)


def shard_batch(names: list[str]) -> cst.SimpleStatementLine:
    lhs = ", ".join(names)
    value = f"({lhs},)" if len(names) == 1 else f"({lhs})"
    return cst.parse_statement(f"{lhs} = jax.device_put({value}, data_sharding)\n")


def loop_names(target: cst.BaseExpression) -> list[str] | None:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)) and all(
            isinstance(e.value, cst.Name) for e in target.elements):
        return [e.value.value for e in target.elements]
    return None


def loader_function(name: str, param: str, pipeline: cst.BaseExpression,
                    leading: list[cst.EmptyLine]) -> cst.FunctionDef:
    text = code(pipeline)
    if len(text) > 70:  # one stage per line
        for stage in (".shuffle(", ".batch(", ".map("):
            text = text.replace(stage, "\n        " + stage, 1)
        text = "(" + text + ")"
    fn = cst.parse_statement(f"def {name}({param}):\n    return {text}\n")
    assert isinstance(fn, cst.FunctionDef)
    return fn.with_changes(leading_lines=leading)



def _map_dataset_expr(dataset: cst.BaseExpression | None, index: DataIndex) -> bool:
    """Whether a loader's dataset is a map-style dataset the pipeline sources directly: a
    variable not bound to an IterableDataset, or one built inline by calling a name
    (``DataLoader(make_data(640), ...)``) that is not an IterableDataset subclass."""
    if isinstance(dataset, cst.Call) and isinstance(dataset.func, cst.Name):
        return dataset.func.value not in index.iterable_classes
    return isinstance(dataset, cst.Name) and dataset.value not in index.iterable_datasets
