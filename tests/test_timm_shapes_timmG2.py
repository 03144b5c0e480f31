"""Shapes of timm's model code that pass ``rngs`` to the modules they build, or do not
(benchmarks/timm_sweep.py, docs/timm-sweep.md, the fourteenth run's "rngs plumbing"), each
on a package of our own written that way, converted, built and verified against torch
(outputs and gradients, in float64, the pass that decides):

* a function that builds a module itself (so its ``rngs`` are its own keyword, no longer in
  its ``**kwargs``) and hands a module class and its kwargs to a builder function of another
  module, copied into the mirror unconverted (timm's vitamin ``_create_vitamin``: a backbone
  built, then ``build_model_with_cfg(VisionTransformer, variant, pretrained, **kwargs)``,
  which does ``model_cls(**kwargs)``; the class is of a third module, given a
  ``partial(HybridEmbed, backbone=backbone)`` embed layer and an MLP class of the file): the
  call passes ``rngs=rngs`` on; it did not ("VisionTransformer.__init__() missing 1 required
  keyword-only argument: 'rngs'").
"""

from __future__ import annotations

import textwrap

from test_timm_shapes_timmQ import _package, _verifies_package

EMBED = textwrap.dedent('''
    import torch.nn as nn


    class PatchEmbed(nn.Module):
        def __init__(self, in_chans=3, embed_dim=8, patch_size=2, device=None, dtype=None):
            super().__init__()
            self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)

        def forward(self, x):
            return self.proj(x).flatten(2).transpose(1, 2)


    class HybridEmbed(nn.Module):
        def __init__(self, backbone, in_chans=3, embed_dim=8, patch_size=1, feature_dim=4, proj=True, device=None, dtype=None):
            super().__init__()
            self.backbone = backbone
            if proj:
                self.proj = nn.Conv2d(feature_dim, embed_dim, patch_size, stride=patch_size)
            else:
                self.proj = nn.Identity()

        def forward(self, x):
            return self.proj(self.backbone(x)).flatten(2).transpose(1, 2)


    class Mlp(nn.Module):
        def __init__(self, dim, hidden, act_layer=nn.GELU):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.act = act_layer()
            self.fc2 = nn.Linear(hidden, dim)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))
''')

BUILDER = textwrap.dedent('''
    def build_model_with_cfg(model_cls, variant, pretrained, feature_cfg=None, **kwargs):
        model = model_cls(**kwargs)
        model.default_cfg = {"variant": variant}
        return model
''')

VIT = textwrap.dedent('''
    import torch
    import torch.nn as nn

    from ..layers.embed import Mlp, PatchEmbed


    class Block(nn.Module):
        def __init__(self, dim, mlp_ratio=2.0, mlp_layer=Mlp):
            super().__init__()
            self.norm = nn.LayerNorm(dim)
            self.mlp = mlp_layer(dim, int(dim * mlp_ratio))

        def forward(self, x):
            return x + self.mlp(self.norm(x))


    class VisionTransformer(nn.Module):
        def __init__(self, in_chans=3, embed_dim=8, depth=2, num_classes=3, patch_size=2,
                     embed_layer=PatchEmbed, block_fn=Block, mlp_layer=Mlp, mlp_ratio=2.0,
                     class_token=True, device=None, dtype=None):
            super().__init__()
            dd = {'device': device, 'dtype': dtype}
            self.patch_embed = embed_layer(in_chans=in_chans, embed_dim=embed_dim,
                                           patch_size=patch_size, **dd)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim, **dd)) if class_token else None
            self.blocks = nn.Sequential(*[
                block_fn(embed_dim, mlp_ratio=mlp_ratio, mlp_layer=mlp_layer) for _ in range(depth)])
            self.norm = nn.LayerNorm(embed_dim)
            self.head = nn.Linear(embed_dim, num_classes)
            if self.cls_token is not None:
                nn.init.normal_(self.cls_token, std=1e-6)

        def forward(self, x):
            x = self.patch_embed(x)
            if self.cls_token is not None:
                x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
            x = self.norm(self.blocks(x))
            return self.head(x.mean(1))
''')

HYBRID = textwrap.dedent('''
    from functools import partial

    import torch.nn as nn

    from ..layers.embed import HybridEmbed
    from ._builder import build_model_with_cfg
    from .vit import VisionTransformer


    class GeGluMlp(nn.Module):
        def __init__(self, in_features, hidden_features, act_layer=nn.GELU, drop=0.0):
            super().__init__()
            self.norm = nn.LayerNorm(in_features)
            self.w0 = nn.Linear(in_features, hidden_features)
            self.act = act_layer()
            self.w1 = nn.Linear(in_features, hidden_features)
            self.w2 = nn.Linear(hidden_features, in_features)

        def forward(self, x):
            x = self.norm(x)
            return self.w2(self.act(self.w0(x)) * self.w1(x))


    class Stages(nn.Module):
        def __init__(self, in_chans=3, out_chs=4, device=None, dtype=None):
            super().__init__()
            self.conv = nn.Conv2d(in_chans, out_chs, 3, stride=2, padding=1, device=device, dtype=dtype)
            self.norm = nn.BatchNorm2d(out_chs)

        def forward(self, x):
            return self.norm(self.conv(x)).relu()


    def _create_hybrid(variant, pretrained=False, embed_dim=8, **kwargs):
        dd = {'device': kwargs.get('device', None), 'dtype': kwargs.get('dtype', None)}
        backbone = Stages(in_chans=kwargs.get('in_chans', 3), **dd)
        kwargs['embed_layer'] = partial(HybridEmbed, backbone=backbone, proj=True)
        kwargs.setdefault('patch_size', 1)
        return build_model_with_cfg(
            VisionTransformer, variant, pretrained, feature_cfg=dict(out_indices=3),
            embed_dim=embed_dim, **kwargs)


    def hybrid_small(pretrained=False, **kwargs):
        model_args = dict(embed_dim=8, depth=2, mlp_layer=GeGluMlp, mlp_ratio=2., class_token=False)
        return _create_hybrid('hybrid_small', pretrained=pretrained, **dict(model_args, **kwargs))
''')


def test_a_module_class_and_kwargs_handed_to_a_builder_of_another_module(tmp_path):
    pkg = _package(tmp_path / "gbuildpkg", HYBRID, {"embed": EMBED})
    (pkg / "models" / "_builder.py").write_text(BUILDER)
    (pkg / "models" / "vit.py").write_text(VIT)
    _verifies_package(pkg, "hybrid_small", "float32[2,3,8,8]")
