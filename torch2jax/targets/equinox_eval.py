"""The evaluation step under the equinox target (equinox_training.py writes it where the NNX
pass wrote its ``eval_step``, or where the file evaluates a model outside one)."""

from __future__ import annotations

import libcst as cst


def eval_step(stateful: bool, batched: bool | None = False, draws: bool = False
              ) -> cst.FunctionDef:
    """The evaluation step; ``batched``: the models are kept batched (called on the batch as
    they are), None: not known here (a class of another file), decided by its ``batched``;
    ``draws``: their forward draws (a VAE's sample), in inference mode too: the step takes a
    key (one per example for a model mapped over the batch)."""
    if draws:
        head = f"@eqx.filter_jit\ndef eval_step(model, {'state, ' if stateful else ''}*inputs, key):\n"
        keys = "jax.random.split(key, inputs[0].shape[0])"
        if batched:
            body = f"    return model(*inputs{', state' if stateful else ''}, key=key)" + (
                "[0]\n" if stateful else "\n")
        elif stateful:
            body = (f"    return jax.vmap(lambda k, *xs: model(*xs, state, key=k)[0], "
                    f"axis_name=\"batch\")({keys}, *inputs)\n")
        else:
            body = f"    return jax.vmap(model)(*inputs, key={keys})\n"
        return cst.parse_statement(head + body)
    if batched is None:
        return cst.parse_statement(
            "@eqx.filter_jit\ndef eval_step(model, *inputs):\n"
            "    if getattr(model, \"batched\", False):  # kept batched by the converter\n"
            "        return model(*inputs)\n"
            "    return jax.vmap(model)(*inputs)\n")
    if batched:  # the models kept batched: called on the batch as they are
        src = ("@eqx.filter_jit\ndef eval_step(model, *inputs):\n    return model(*inputs)\n"
               if not stateful else "@eqx.filter_jit\ndef eval_step(model, state, *inputs):\n"
               "    return model(*inputs, state)[0]\n")
        return cst.parse_statement(src)
    if stateful:
        src = ("@eqx.filter_jit\ndef eval_step(model, state, *inputs):\n"
               "    return jax.vmap(lambda *xs: model(*xs, state)[0], "
               "axis_name=\"batch\")(*inputs)\n")
    else:
        src = "@eqx.filter_jit\ndef eval_step(model, *inputs):\n    return jax.vmap(model)(*inputs)\n"
    return cst.parse_statement(src)
