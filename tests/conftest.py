"""Test-wide settings.

Tests that compare a translation with torch run JAX at full float32 precision: on a GPU, JAX's
default lets float32 matmuls and convolutions use TF32 (about 1e-3 relative), while torch's
reference runs in exact float32 on the CPU. ``torch2jax verify`` sets the same precision
around its JAX side (docs/verification.md); this covers the tests that call converted code
directly. On a CPU the setting changes nothing.
"""

import jax

jax.config.update("jax_default_matmul_precision", "highest")
