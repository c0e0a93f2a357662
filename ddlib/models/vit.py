"""DC-Bench's ViT (``networks/vit.py`` of justincui03/dc_benchmark, lucid-rains' vit-pytorch, built
in ``networks/network_utils.py`` with patch 4, dim 512, depth 6, heads 8, mlp_dim 512, dropout 0.1,
emb_dropout 0.1), as timm's ``VisionTransformer``.

The two are the same network: pre-norm blocks of multi-head attention (8 heads of 64, no qkv bias,
output projection with bias) and a GELU MLP of width 512, a class token and learnt position
embeddings for it and every patch, a final LayerNorm and a linear head on the class token. A linear
patch embedding of flattened 4x4 patches is timm's 4x4 stride-4 convolution. DC-Bench's ``dropout``
is timm's ``proj_drop_rate`` (after the attention projection and after both MLP layers) and its
``emb_dropout`` timm's ``pos_drop_rate``; it has no dropout on attention weights or before the head,
so ``attn_drop_rate`` and ``drop_rate`` stay 0. LayerNorm keeps PyTorch's eps 1e-5 (timm uses 1e-6).
9,523,722 parameters on CIFAR-10: patches 48*512 + 512, positions 65*512, class token 512, six
blocks of 2*1,024 (norms) + 512*1,536 (qkv) + 512*512 + 512 (proj) + 2*(512*512 + 512) (MLP),
final norm 1,024, head 512*10 + 10.

Initialisation is DC-Bench's, not timm's: PyTorch's defaults for the linear, convolution and
LayerNorm layers, and a standard normal for the class token and position embeddings (vit-pytorch's
``torch.randn``). That is what the published DC-Bench ViT numbers were trained from, and it matches
the other models here, which keep DC's PyTorch defaults; timm's truncated-normal(0.02) scheme is
tuned for long ImageNet schedules, not for training from a few images per class.
"""

from __future__ import annotations

import functools
from functools import partial

import torch
import torch.nn as nn

from ddlib.models._registry import register_model


@functools.cache
def _vit_class():
    """Built on first use, so importing the registry does not import timm (over a second per process)."""
    from timm.models.vision_transformer import VisionTransformer

    class ViT(VisionTransformer):
        """timm's ViT with DC-Bench's shape and init; ``embed(x)`` is the pre-logits class token."""

        def __init__(self, channels, num_classes, image_size, patch_size=4, width=512, depth=6, heads=8,
                     mlp_dim=512, dropout=0.1, emb_dropout=0.1):
            image_size = tuple(int(s) for s in image_size)
            if any(s < patch_size or s % patch_size for s in image_size):
                raise ValueError(f"image size {image_size} does not fit the ViT: each side must be a multiple "
                                 f"of the patch size {patch_size}")
            super().__init__(img_size=image_size, patch_size=patch_size, in_chans=channels, num_classes=num_classes,
                             global_pool="token", class_token=True, embed_dim=width, depth=depth, num_heads=heads,
                             mlp_ratio=mlp_dim / width, qkv_bias=False, drop_rate=0.0, pos_drop_rate=emb_dropout,
                             proj_drop_rate=dropout, attn_drop_rate=0.0, norm_layer=partial(nn.LayerNorm, eps=1e-5),
                             weight_init="skip")
            for m in self.modules():  # PyTorch's defaults, whatever timm's constructors did
                if isinstance(m, (nn.Linear, nn.Conv2d, nn.LayerNorm)):
                    m.reset_parameters()
            with torch.no_grad():  # vit-pytorch: nn.Parameter(torch.randn(...)); timm left them uninitialised
                self.cls_token.normal_()
                self.pos_embed.normal_()
            self.image_size = image_size
            self.feature_dim = self.num_features

        def embed(self, x: torch.Tensor) -> torch.Tensor:
            return self.forward_head(self.forward_features(x), pre_logits=True)

    return ViT


def __getattr__(name: str):
    if name == "ViT":
        return _vit_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@register_model("vit")
def vit(channels, num_classes, image_size):
    """DC-Bench's ViT: patch 4, width 512, depth 6, 8 heads, MLP 512, dropout 0.1."""
    return _vit_class()(channels, num_classes, image_size)
