"""The rewriter's handling of type annotations: a torch type named in an annotation
(``Tensor``, ``nn.Conv2d``, ``torch.device``) in the target's terms (a mixin of
``TorchToJax``, split from passes/rewrite_attributes.py)."""

from __future__ import annotations

import re

import libcst as cst

from torch2jax.passes.common import expr
from torch2jax.passes.rewrite_support import _ANNOTATION_TYPES, _FINAL
from torch2jax.targets import linen as linen_target


class AnnotationsMixin:
    def visit_Annotation(self, node) -> None:
        self._in_annotation += 1

    def leave_Annotation(self, original_node, updated_node):
        self._in_annotation -= 1
        return updated_node

    def _annotation_type(self, original: cst.BaseExpression) -> cst.BaseExpression | None:
        """A torch type named in an annotation (``Tensor``, ``nn.Conv2d``), in JAX terms."""
        q = self.q(original)
        if not q or not q.startswith("torch.") or q in _FINAL:
            return None
        if q in ("torch.Tensor", "torch.FloatTensor", "torch.LongTensor", "torch.BoolTensor",
                 "torch.nn.parameter.Parameter", "torch.nn.Parameter"):
            self.need("jax")
            return expr("jax.Array")
        if q in ("torch.nn.Module", "torch.nn.modules.module.Module"):
            self.need("nnx")
            return expr(self.target.module_base)
        if q in _ANNOTATION_TYPES:  # device: torch.device, dtype: torch.dtype
            self.need(_ANNOTATION_TYPES[q].split(".")[0])
            return expr(_ANNOTATION_TYPES[q])
        rule = self.rules.layers.get(q)
        target = rule.targets.get("nnx") if rule else None
        if target and re.fullmatch(r"nnx\.[A-Z]\w*", target):
            if self.target.setup_modules:
                if target in linen_target.CLASSES:
                    self.need("linen")
                    return expr(linen_target.CLASSES[target])
            else:
                self.need("nnx")
                return expr(target)
        self.diag(original, "annotation", "error", f"type annotation {q}: no JAX type")
        return None
