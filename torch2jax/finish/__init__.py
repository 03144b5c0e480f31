"""The last step of a conversion: checks on the converted file before it is returned
(it parses, every name it reads is bound, statements removed only when nothing reads what they
bind, info diagnostics match the code written). See :mod:`torch2jax.finish.invariants`."""
