"""A model that is a Sequential built at the top of a script, with no class of its own
(``model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))``): NNX writes
``nnx.Sequential(nnx.Linear(..., rngs=nnx.Rngs(k)), jax.nn.relu, ...)``, and equinox's form is
``eqx.nn.Sequential([eqx.nn.Linear(..., key=k), eqx.nn.Lambda(jax.nn.relu), ...])``, a model
of one example that the training code maps over the batch like a model class of the file
(equinox_training.py).

Only layers that hold no state are taken (linear layers, layer norms, dropout, activations):
a Sequential with BatchNorm keeps its NNX line, marked."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import libcst as cst
import libcst.matchers as m

from torch2jax.passes.common import code

# the pseudo classes of such models among the model classes, and their flags (state, key):
# a Sequential with dropout takes a key when called (eqx.nn.Sequential splits it among its
# layers), and eqx.nn.inference_mode turns its dropout off
SEQUENTIAL = "eqx.nn.Sequential"
KEYED = "eqx.nn.Sequential "
CLASSES = {SEQUENTIAL: (False, False), KEYED: (False, True)}
# the layer kinds a top-level Sequential may hold (called on one example, no state)
_KINDS = frozenset({"linear", "layernorm", "dropout"})
_RNGS = m.Call(func=m.Attribute(value=m.Name("nnx"), attr=m.Name("Rngs")),
               args=[m.Arg(keyword=None)])


def model_class(value: cst.BaseExpression) -> str | None:
    """The pseudo class of ``nnx.Sequential(...)`` (KEYED with a dropout layer), or None."""
    if not is_sequential(value):
        return None
    return KEYED if any(m.matches(a.value, m.Call(func=m.Attribute(
        value=m.Name("nnx"), attr=m.Name("Dropout")))) for a in value.args) else SEQUENTIAL


def is_sequential(value: cst.BaseExpression) -> bool:
    """``nnx.Sequential(...)`` with positional layers only."""
    return m.matches(value, m.Call(func=m.Attribute(value=m.Name("nnx"),
                                                    attr=m.Name("Sequential")))) and all(
        a.keyword is None and not a.star for a in value.args) and bool(value.args)


def _elementwise(v: cst.BaseExpression) -> bool:
    """An activation the NNX pass wrote as a function (``jax.nn.relu``,
    ``partial(jax.nn.leaky_relu, negative_slope=0.2)``) that reads no axis: the same on one
    example as on the batch."""
    if m.matches(v, m.Attribute(value=m.Attribute(value=m.Name("jax"), attr=m.Name("nn")))):
        return True
    return m.matches(v, m.Call(func=m.Name("partial"))) and bool(v.args) and m.matches(
        v.args[0].value, m.Attribute(value=m.Attribute(value=m.Name("jax"), attr=m.Name(
            "nn")))) and all(a.keyword is not None and "axis" not in a.keyword.value
                             for a in v.args[1:])


def sequential_model(value: cst.Call, layer_of: Callable | None) -> str | None:
    """The equinox code of ``nnx.Sequential(...)`` built outside a module, each layer with the
    key its ``nnx.Rngs`` was given; None where a layer is not one this module takes, or
    ``layer_of`` (equinox.py's ``_training_layer``) refuses one."""
    if layer_of is None or not is_sequential(value):
        return None
    items = []
    for a in value.args:
        v = a.value
        if _elementwise(v):
            items.append(f"eqx.nn.Lambda({code(v)})")
            continue
        k = next((x.value for x in getattr(v, "args", ()) if x.keyword is not None
                  and x.keyword.value == "rngs"), None)
        if not isinstance(v, cst.Call) or not m.matches(k, _RNGS):
            return None
        found = layer_of(v)
        if isinstance(found, str) or found is None or found[1] not in _KINDS:
            return None
        seed = k.args[0].value
        key = f"jax.random.key({code(seed)})" if isinstance(seed, cst.Integer) else code(seed)
        items.append(code(found[0]).replace("__needs_key__", key) if found[1] != "dropout"
                     else code(found[0]))
    return f"{SEQUENTIAL}([{', '.join(items)}])"


def model_build(value: cst.BaseExpression, classes: dict,
                builders: Mapping[str, str] | None = None) -> str | None:
    """The model class a statement of the training code builds (equinox_training.py): of
    ``Class(..., rngs=nnx.Rngs(k))`` (a model class of this file, or one imported, with None
    for its flags in ``classes``), or of ``build(..., rngs=...)``, a function of the file that
    returns one (``builders``); SEQUENTIAL for a top-level ``nnx.Sequential(...)``."""
    if SEQUENTIAL in classes and is_sequential(value):
        return model_class(value)
    if not m.matches(value, m.Call(func=m.Name(), args=[m.ZeroOrMore(), m.Arg(
            keyword=m.Name("rngs"), value=m.Call(func=m.Attribute(
                value=m.Name("nnx"), attr=m.Name("Rngs"))))])):
        return None
    name = value.func.value
    cls = (builders or {}).get(name, name)
    return cls if cls in classes else None
