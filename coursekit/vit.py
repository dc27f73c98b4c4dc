"""Chapter 9: the vision transformer (ViT) and its patches.

A ViT (Dosovitskiy et al., 2021) reads an image as a sequence. It cuts the image into
non-overlapping ``P x P`` patches (:func:`patchify`), maps each flattened patch to a
``C``-wide token with one linear layer (:class:`PatchEmbedding`), puts a learned ``[CLS]``
token in front, adds one learned position vector per token (1-D positions, numbered in
row-major order; :func:`add_cls_and_positions`), and runs Chapter 4's *pre-norm*
:class:`~coursekit.layers.Encoder`. A linear classifier reads the encoder's (normalised)
output at ``[CLS]``.

Shapes: images are ``(B, C_in, H_img, W_img)`` (``C_in`` colour channels); ``P`` is the
patch size; ``N_p = (H_img / P) (W_img / P)`` the number of patches and ``T = N_p + 1``
the number of tokens; ``C``, ``H``, ``D``, ``L`` as everywhere (width, heads, head width,
layers) and ``K`` the number of classes.

Conventions, stated once and tested:

- **Patch order and layout.** Patches are numbered row by row (patch ``n`` is at grid row
  ``n // (W_img / P)``, column ``n % (W_img / P)``), and each patch is flattened
  channel-first, as ``(C_in, P, P)``: the layout of ``F.unfold`` and of a ``Conv2d``
  weight, so the linear patch embedding is exactly a ``Conv2d`` with kernel and stride
  ``P`` whose weight is ``proj.weight.view(C, C_in, P, P)``.
- **Hugging Face.** :func:`to_hf_state_dict` / :func:`from_hf_state_dict` map to and from
  ``transformers.ViTForImageClassification`` (its patch projection is that ``Conv2d``;
  its query, key and value are our ``qkv_proj`` cut in three).

The book trains a small one on scikit-learn's 8x8 digits: the data, the training recipes and
the baselines are in :mod:`coursekit.experiments.digits`.

Over 500 lines: the model, its patches, and the exercise's experiment and stretch part
(``blank_patch_share``, ``sincos_2d_positions``), whose code the solution notebook holds: a test keeps
the answers and this module the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from coursekit._config import check_transformer_config
from coursekit.hf_names import NameTable
from coursekit.layers import Encoder, encoder_layer_params, layer_norm_params
from coursekit.positional import LearnedPositionalEmbedding

__all__ = [
    "ViTConfig",
    "VIT_PRESETS",
    "ViT",
    "PatchEmbedding",
    "patchify",
    "unpatchify",
    "add_cls_and_positions",
    "cls_attention",
    "attention_weights",
    "mean_attention_distance",
    "vit_params",
    "HF_NAMES",
    "to_hf_state_dict",
    "from_hf_state_dict",
    "hf_config_kwargs",
    "blank_patch_share",
    "sincos_2d_positions",
]


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class ViTConfig:
    """The shape of a :class:`ViT`; the keys are its constructor's.

    Args:
        image_size: ``H_img = W_img`` (square images).
        patch_size: ``P``; must divide ``image_size``.
        in_channels: ``C_in`` (1 for grey, 3 for colour).
        n_classes: ``K``.
        n_layers: encoder layers ``L``.
        n_heads: ``H``; must divide ``d_model``.
        d_model: ``C``.
        d_ff: feed-forward width; ``None`` for ``4 C``.
        dropout: on the embeddings, attention weights, sub-layer outputs and feed-forward
            activations (in training mode).
        eps: the layer norms' epsilon (``1e-6`` in the ViT paper's code).
    """

    image_size: int
    patch_size: int
    in_channels: int
    n_classes: int
    n_layers: int
    n_heads: int
    d_model: int
    d_ff: int | None = None
    dropout: float = 0.0
    eps: float = 1e-6

    def __post_init__(self):
        check_transformer_config(
            self, ("image_size", "patch_size", "in_channels", "n_classes", "n_layers", "n_heads", "d_model")
        )
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size={self.patch_size} must divide image_size={self.image_size}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")

    @property
    def grid(self) -> int:
        """Patches per row (and per column): ``image_size / P``."""
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        """``N_p``."""
        return self.grid * self.grid

    @property
    def patch_dim(self) -> int:
        """Values in one flattened patch, ``C_in P^2``."""
        return self.in_channels * self.patch_size**2


#: ``nano`` for tests; ``small`` is the book's digit classifier (8x8 grey images, 4x4
#: patches: 4 tokens and [CLS]); the rest are the published shapes of Dosovitskiy et al. (2021, table 1) with a
#: 1000-class head (ImageNet), for parameter arithmetic.
VIT_PRESETS: dict[str, ViTConfig] = {
    "nano": ViTConfig(
        image_size=8, patch_size=2, in_channels=3, n_classes=5, n_layers=2, n_heads=2, d_model=16
    ),
    "small": ViTConfig(
        image_size=8, patch_size=4, in_channels=1, n_classes=10, n_layers=4, n_heads=4, d_model=64
    ),
    "vit-b/16": ViTConfig(
        image_size=224, patch_size=16, in_channels=3, n_classes=1000, n_layers=12, n_heads=12, d_model=768
    ),
    "vit-l/16": ViTConfig(
        image_size=224, patch_size=16, in_channels=3, n_classes=1000, n_layers=24, n_heads=16, d_model=1024
    ),
    "vit-h/14": ViTConfig(
        image_size=224, patch_size=14, in_channels=3, n_classes=1000, n_layers=32, n_heads=16, d_model=1280
    ),
}


def vit_params(cfg: ViTConfig) -> int:
    """Exact number of parameters of ``ViT(cfg)``.

    Patch embedding ``C_in P^2 C + C``, ``[CLS]`` ``C``, positions ``(N_p + 1) C``, ``L``
    pre-norm layers of ``12 C^2 + 13 C`` (at ``d_ff = 4 C``, Chapter 4), the final norm
    ``2 C`` and the classifier ``C K + K``.

    Example: ``vit_params(VIT_PRESETS["vit-b/16"])`` is 86,567,656.
    """
    C = cfg.d_model
    embeddings = cfg.patch_dim * C + C + C + (cfg.n_patches + 1) * C
    layers = cfg.n_layers * encoder_layer_params(C, cfg.d_ff)
    return embeddings + layers + layer_norm_params(C) + C * cfg.n_classes + cfg.n_classes


# --------------------------------------------------------------------------- patches


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """Cut images into non-overlapping square patches, each flattened channel-first.

    Patch ``n`` covers rows ``P r .. P r + P - 1`` and columns ``P c .. P c + P - 1`` with
    ``r, c = divmod(n, W_img / P)`` (row-major order); its values are listed as
    ``(C_in, P, P)``, the layout of ``F.unfold`` and of a ``Conv2d`` weight. Example: a
    ``(1, 1, 4, 4)`` image holding ``0 .. 15`` with ``P = 2`` gives the patches
    ``[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]``.

    Args:
        images: ``(B, C_in, H_img, W_img)``; ``P`` must divide ``H_img`` and ``W_img``.
        patch_size: ``P``.

    Returns:
        ``(B, N_p, C_in P^2)`` in the images' dtype, with ``N_p = (H_img / P) (W_img / P)``.

    Raises:
        ValueError: ``images`` is not 4-D, ``patch_size`` is below 1, or ``P`` does not divide
            its height and width.
    """
    if images.dim() != 4:
        raise ValueError(f"expected images of shape (B, C_in, H_img, W_img), got {tuple(images.shape)}")
    B, C_in, H_img, W_img = images.shape
    P = patch_size
    if P < 1:
        raise ValueError(f"patch_size must be a positive integer, got {P}")
    if H_img % P or W_img % P:
        raise ValueError(f"the image size {H_img}x{W_img} is not divisible by patch_size={P}")
    x = images.reshape(B, C_in, H_img // P, P, W_img // P, P)  # (B, C_in, rows, P, cols, P)
    x = x.permute(0, 2, 4, 1, 3, 5)  # (B, rows, cols, C_in, P, P)
    return x.reshape(B, (H_img // P) * (W_img // P), C_in * P * P)  # (B, N_p, C_in P^2)


def unpatchify(patches: torch.Tensor, patch_size: int, image_size: int | tuple[int, int]) -> torch.Tensor:
    """The inverse of :func:`patchify`: ``(B, N_p, C_in P^2)`` back to ``(B, C_in, H_img, W_img)``.

    Args:
        patches: ``(B, N_p, C_in P^2)`` in :func:`patchify`'s order and layout.
        patch_size: ``P``.
        image_size: ``H_img`` (square) or ``(H_img, W_img)``; ``P`` must divide both.

    Raises:
        ValueError: the shapes do not fit together.
    """
    H_img, W_img = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    P = patch_size
    if not isinstance(P, int) or P < 1 or H_img % P or W_img % P:
        raise ValueError(
            f"patch_size={P!r} must be a positive integer dividing the image size {H_img}x{W_img}"
        )
    rows, cols = H_img // P, W_img // P
    if patches.dim() != 3 or patches.shape[1] != rows * cols or patches.shape[2] % (P * P):
        raise ValueError(
            f"expected patches of shape (B, {rows * cols}, C_in * {P * P}) for {H_img}x{W_img} images "
            f"and P={P}, got {tuple(patches.shape)}"
        )
    B, C_in = patches.shape[0], patches.shape[2] // (P * P)
    x = patches.reshape(B, rows, cols, C_in, P, P)  # (B, rows, cols, C_in, P, P)
    x = x.permute(0, 3, 1, 4, 2, 5)  # (B, C_in, rows, P, cols, P)
    return x.reshape(B, C_in, H_img, W_img)  # (B, C_in, H_img, W_img)


class PatchEmbedding(nn.Module):
    """Embed each ``P x P`` patch with one linear map: ``proj(patchify(images, P))``.

    The same ``C_in P^2 -> C`` matrix is applied to every patch, which is a ``Conv2d``
    with kernel size and stride ``P`` (Dosovitskiy et al., 2021, eq. 1).

    Args:
        image_size: ``H_img = W_img``; ``P`` must divide it.
        patch_size: ``P``.
        in_channels: ``C_in``.
        d_model: ``C``.

    Submodules: ``proj`` (``nn.Linear(C_in P^2, C)``).

    Raises:
        ValueError: ``patch_size`` does not divide ``image_size``; in ``forward``, images that are
            not ``(B, in_channels, image_size, image_size)``.
    """

    def __init__(self, image_size: int, patch_size: int, in_channels: int, d_model: int):
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"patch_size={patch_size} must divide image_size={image_size}")
        self.image_size, self.patch_size, self.in_channels = image_size, patch_size, in_channels
        self.proj = nn.Linear(in_channels * patch_size * patch_size, d_model)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H_img, W_img) -> (B, N_p, C)``; the image must have the configured size and channels."""
        C_in, size = self.in_channels, self.image_size
        if images.dim() != 4 or tuple(images.shape[1:]) != (C_in, size, size):
            raise ValueError(
                f"expected images of shape (B, {C_in}, {size}, {size}), got {tuple(images.shape)}"
            )
        return self.proj(patchify(images, self.patch_size))  # (B, N_p, C)


def add_cls_and_positions(
    patches: torch.Tensor, cls_token: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Put the ``[CLS]`` token in front of every sequence, then add one position vector per token.

    ``out[b] = [cls, x_1, ..., x_{N_p}] + positions``: ``[CLS]`` is token 0 and gets
    ``positions[0]``; patch ``n`` is token ``n + 1`` and gets ``positions[n + 1]``.

    Args:
        patches: embedded patches ``(B, N_p, C)``.
        cls_token: the learned ``[CLS]`` vector, ``(1, 1, C)``, shared by the batch.
        positions: ``(N_p + 1, C)``, one learned vector per token.

    Returns:
        ``(B, N_p + 1, C)``, a new tensor in the inputs' dtype.

    Raises:
        ValueError: ``patches`` is not 3-D, ``cls_token`` is not ``(1, 1, C)`` or ``positions``
            is not ``(N_p + 1, C)``.
    """
    if patches.dim() != 3:
        raise ValueError(f"expected patches of shape (B, N_p, C), got {tuple(patches.shape)}")
    B, N_p, C = patches.shape
    T = N_p + 1  # tokens: [CLS] and the patches
    if tuple(cls_token.shape) != (1, 1, C) or tuple(positions.shape) != (T, C):
        raise ValueError(
            f"for patches {tuple(patches.shape)} expected cls_token (1, 1, {C}) and positions "
            f"({T}, {C}), got {tuple(cls_token.shape)} and {tuple(positions.shape)}"
        )
    cls = cls_token.expand(B, 1, C)  # (B, 1, C): the same vector for every image
    return torch.cat([cls, patches], dim=1) + positions  # (B, N_p + 1, C)


# --------------------------------------------------------------------------- the model


class ViT(nn.Module):
    """A vision transformer for image classification (Dosovitskiy et al., 2021).

    ``logits = head(encoder(dropout(add_cls_and_positions(patch_embed(images), cls_token,
    pos_emb)))[:, 0])``, where the pre-norm ``encoder`` ends with its final layer norm.

    Args:
        cfg: a :class:`ViTConfig` (see :data:`VIT_PRESETS`).

    Submodules: ``patch_embed`` (:class:`PatchEmbedding`), ``cls_token`` (a ``(1, 1, C)``
    parameter), ``pos_emb`` (Chapter 3's
    :class:`~coursekit.positional.LearnedPositionalEmbedding` with ``N_p + 1`` rows),
    ``dropout``, ``encoder`` (Chapter 4's pre-norm :class:`~coursekit.layers.Encoder`,
    exact GELU, its layer norms computed by :class:`~coursekit.layers.FusedLayerNorm`) and ``head``
    (``nn.Linear(C, K)``).
    """

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        if not isinstance(cfg, ViTConfig):
            raise TypeError(f"ViT takes a ViTConfig (see VIT_PRESETS), got {type(cfg).__name__}")
        self.cfg = cfg
        self.patch_embed = PatchEmbedding(cfg.image_size, cfg.patch_size, cfg.in_channels, cfg.d_model)
        self.cls_token = nn.Parameter(torch.randn(1, 1, cfg.d_model) * 0.02)
        self.pos_emb = LearnedPositionalEmbedding(cfg.n_patches + 1, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(
            cfg.n_layers,
            cfg.d_model,
            cfg.n_heads,
            cfg.d_ff,
            cfg.dropout,
            "gelu",
            norm_first=True,
            eps=cfg.eps,
            norm="fused",
        )  # fused: faster on small tensors
        self.head = nn.Linear(cfg.d_model, cfg.n_classes)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The encoder's input: ``(B, C_in, H_img, W_img) -> (B, N_p + 1, C)``, ``[CLS]`` first.

        ``self.dropout`` acts on the whole sequence (in training mode); the positions are made on
        the images' device.
        """
        x = self.patch_embed(images)  # (B, N_p, C)
        positions = self.pos_emb(torch.arange(x.shape[1] + 1, device=x.device))  # (N_p + 1, C)
        return self.dropout(add_cls_and_positions(x, self.cls_token, positions))  # (B, N_p + 1, C)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Class logits ``(B, K)`` of images ``(B, C_in, H_img, W_img)``, read from the ``[CLS]`` output."""
        h = self.encoder(self.embed(images))  # (B, N_p + 1, C), normalised by the stack's final norm
        return self.head(h[:, 0])  # (B, K): the [CLS] token only


@torch.no_grad()
def attention_weights(model: ViT, images: torch.Tensor) -> torch.Tensor:
    """Every layer's attention weights, one matrix per head, ``[CLS]`` first.

    Each layer's weights are recomputed from its (pre-norm) input ``norm1(x)``, then the layer runs
    as usual; the model runs in eval mode (its mode is restored). The same numbers as Hugging Face's
    ``output_attentions=True``, stacked.

    Args:
        model: a :class:`ViT`.
        images: ``(B, C_in, H_img, W_img)``.

    Returns:
        ``(L, B, H, T, T)`` with ``T = N_p + 1``: entry ``[l, b, h, i, j]`` is how much query token
        ``i`` attends to key token ``j`` in head ``h`` of layer ``l``; token 0 is ``[CLS]``, token
        ``n + 1`` patch ``n``. Every row sums to 1.
    """
    was_training = model.training
    model.eval()
    maps = []
    try:
        x = model.embed(images)  # (B, T, C)
        for layer in model.encoder.layers:
            _, weights = layer.self_attn(layer.norm1(x), need_weights=True)  # (B, H, T, T)
            maps.append(weights)
            x = layer(x)
    finally:
        model.train(was_training)
    return torch.stack(maps)  # (L, B, H, T, T)


@torch.no_grad()
def cls_attention(model: ViT, images: torch.Tensor) -> torch.Tensor:
    """How much the ``[CLS]`` token attends to each patch in the last layer, averaged over heads.

    The last layer of :func:`attention_weights` (which runs the model in eval mode and restores
    its mode).

    Args:
        model: a :class:`ViT`.
        images: ``(B, C_in, H_img, W_img)``.

    Returns:
        ``(B, N_p)``: row ``b`` is the ``[CLS]`` query's weights on the patches (the weight on
        ``[CLS]`` itself is left out, so a row sums to at most 1).
    """
    return attention_weights(model, images)[-1, :, :, 0, 1:].mean(
        dim=1
    )  # (B, N_p): query [CLS], keys the patches


def mean_attention_distance(
    weights: torch.Tensor, grid: int | tuple[int, int], patch_px: float, *, cls_token: bool
) -> torch.Tensor:
    """How far, in pixels, each head looks: the mean attention distance (Dosovitskiy et al., 2021, fig. 7).

    For query patch ``i`` the distance is ``sum_j a_ij |p_i - p_j|``, where ``p`` are patch centres
    in pixels (patch ``n`` at grid row ``n // cols``, column ``n % cols``, ``patch_px`` pixels apart)
    and ``a_ij`` the query's weights on the patches; it is then averaged over the query patches.
    ``[CLS]`` has no place in the image, so with ``cls_token=True`` its row (as a query) and its
    column (as a key) are left out, and each patch query's weights on the patches are rescaled to
    sum to 1: the result is the mean distance of what a patch reads *from patches*. Without
    ``[CLS]`` the same rescaling leaves softmax rows unchanged. Example: uniform attention over a
    ``2 x 2`` grid gives ``patch_px (2 + sqrt 2) / 4`` for every head; attention to itself only, 0.

    Args:
        weights: ``(B, H, T, T)`` attention weights (non-negative), queries on the second-to-last
            axis; ``T = rows cols + 1`` with ``cls_token`` (``[CLS]`` is token 0), else
            ``T = rows cols``.
        grid: patches per side (square grid) or ``(rows, cols)``.
        patch_px: the patch size ``P`` in pixels (the distance between neighbouring patch centres).
        cls_token: whether token 0 is ``[CLS]``; keyword-only and required, so the caller says it.

    Returns:
        ``(B, H)`` in the weights' dtype: one mean distance in pixels per image and head; average
        over the batch for the paper's per-head number.

    Raises:
        ValueError: ``weights`` is not a floating ``(B, H, T, T)`` tensor whose ``T`` fits the grid
            and ``cls_token``, has negative entries, or a patch query puts no weight on any patch;
            a grid side below 1 or ``patch_px`` not positive.
    """
    rows, cols = (grid, grid) if isinstance(grid, int) else tuple(grid)
    if rows < 1 or cols < 1:
        raise ValueError(f"grid sides must be at least 1, got {rows}x{cols}")
    if not patch_px > 0:
        raise ValueError(f"patch_px must be positive, got {patch_px}")
    T = rows * cols + int(cls_token)
    what = f"{rows}x{cols} patches" + (" and [CLS]" if cls_token else "")
    if weights.dim() != 4 or tuple(weights.shape[2:]) != (T, T):
        raise ValueError(f"expected weights of shape (B, H, {T}, {T}) for {what}, got {tuple(weights.shape)}")
    if not weights.is_floating_point():
        raise ValueError(f"expected floating attention weights, got {weights.dtype}")
    if bool((weights < 0).any()):
        raise ValueError("attention weights must be non-negative")
    a = weights[:, :, 1:, 1:] if cls_token else weights  # (B, H, N_p, N_p): patch queries, patch keys
    mass = a.sum(dim=-1, keepdim=True)  # (B, H, N_p, 1)
    if bool((mass == 0).any()):
        raise ValueError("a patch query puts no weight on any patch: its distance is undefined")
    r = torch.arange(rows * cols, device=a.device) // cols  # (N_p,): grid row of each patch
    c = torch.arange(rows * cols, device=a.device) % cols  # (N_p,): grid column
    dist = patch_px * torch.hypot((r[:, None] - r).to(a.dtype), (c[:, None] - c).to(a.dtype))  # (N_p, N_p)
    per_query = (a * dist).sum(dim=-1) / mass.squeeze(-1)  # (B, H, N_p)
    return per_query.mean(dim=-1)  # (B, H)


# --------------------------------------------------------------------------- Hugging Face ViT

#: Our parameter name -> ``transformers.ViTForImageClassification``'s; ``{i}`` is a layer
#: index. Not a plain rename: our ``qkv_proj`` rows are HF's ``q_proj``, ``k_proj`` and
#: ``v_proj`` stacked, HF's patch projection is a ``Conv2d`` (weight ``(C, C_in, P, P)``,
#: ours ``(C, C_in P^2)``) and HF's position table has a leading axis of 1.
HF_NAMES = {
    "cls_token": "vit.embeddings.cls_token",
    "pos_emb.weight": "vit.embeddings.position_embeddings",
    "patch_embed.proj.{p}": "vit.embeddings.patch_embeddings.projection.{p}",
    "encoder.layers.{i}.norm1.{p}": "vit.layers.{i}.layernorm_before.{p}",
    "encoder.layers.{i}.self_attn.out_proj.{p}": "vit.layers.{i}.attention.o_proj.{p}",
    "encoder.layers.{i}.norm2.{p}": "vit.layers.{i}.layernorm_after.{p}",
    "encoder.layers.{i}.ff.linear1.{p}": "vit.layers.{i}.mlp.fc1.{p}",
    "encoder.layers.{i}.ff.linear2.{p}": "vit.layers.{i}.mlp.fc2.{p}",
    "encoder.norm.{p}": "vit.layernorm.{p}",
    "head.{p}": "classifier.{p}",
}
_NAMES = NameTable(
    HF_NAMES,
    our_qkv="encoder.layers.{i}.self_attn.qkv_proj.{p}",
    hf_qkv="vit.layers.{i}.attention.{part}.{p}",
    parts=("q_proj", "k_proj", "v_proj"),
)


def to_hf_state_dict(state_dict: dict[str, torch.Tensor], patch_size: int) -> dict[str, torch.Tensor]:
    """Our :class:`ViT` weights with ``ViTForImageClassification``'s names and shapes.

    ``qkv_proj`` is cut into ``q_proj``, ``k_proj``, ``v_proj`` (``C`` rows each); the patch
    projection ``(C, C_in P^2)`` becomes a ``Conv2d`` weight ``(C, C_in, P, P)`` (the same
    numbers: :func:`patchify` flattens channel-first); the positions get a leading axis.

    Raises:
        ValueError: a key that is not one of a :class:`ViT`'s.
    """
    out = {}
    for key, value in state_dict.items():
        if key == "patch_embed.proj.weight":
            C, patch_dim = value.shape
            value = value.reshape(
                C, patch_dim // (patch_size * patch_size), patch_size, patch_size
            )  # (C, C_in, P, P)
        elif key == "pos_emb.weight":
            value = value.unsqueeze(0)  # (1, T, C)
        out.update(_NAMES.to_hf(key, value, "ViT"))
    return out


def from_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``ViTForImageClassification`` weights with our names and shapes: the inverse of :func:`to_hf_state_dict`.

    Raises:
        ValueError: an unknown key (for instance a pooler: use a model built with
            ``add_pooling_layer=False``, as ``ViTForImageClassification`` is), or a layer
            without all of ``q_proj``, ``k_proj``, ``v_proj``.
    """
    out, qkv = {}, {}
    for key, value in state_dict.items():
        if _NAMES.collect_qkv(key, value, qkv):
            continue
        name = _NAMES.our_name(key)
        if name is None:
            raise ValueError(f"unexpected Hugging Face key {key!r} (ViTForImageClassification is supported)")
        if name == "patch_embed.proj.weight":
            value = value.reshape(value.shape[0], -1)  # (C, C_in, P, P) -> (C, C_in P^2), channel-first
        elif name == "pos_emb.weight":
            value = value.squeeze(0)  # (1, T, C) -> (T, C)
        out[name] = value
    out.update(_NAMES.join_qkv(qkv))
    return out


def hf_config_kwargs(cfg: ViTConfig) -> dict:
    """Keyword arguments of the equal ``transformers.ViTConfig`` (dropout as ours)."""
    return dict(
        image_size=cfg.image_size,
        patch_size=cfg.patch_size,
        num_channels=cfg.in_channels,
        num_labels=cfg.n_classes,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff or 4 * cfg.d_model,
        hidden_act="gelu",
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout,
        layer_norm_eps=cfg.eps,
        qkv_bias=True,
    )


# --------------------------------------------------------------------------- experiment


def blank_patch_share(images: torch.Tensor, patch_size: int) -> float:
    """The share of patches, over all images, whose values are all exactly zero.

    Blank patches become tokens that carry no information yet cost as much attention as any other:
    on scikit-learn's 8x8 digits about half the single pixels (``P = 1``, the tokens of ImageGPT),
    about a quarter of the ``2 x 2`` patches and almost none of the ``4 x 4`` ones are blank.
    Example: a ``(1, 1, 2, 2)`` image ``[[0, 0], [0, 1]]`` has three blank pixels, so
    ``blank_patch_share(image, 1)`` is ``0.75`` and ``blank_patch_share(image, 2)`` is ``0.0``.

    Args:
        images: ``(B, C_in, H_img, W_img)``; ``P`` must divide ``H_img`` and ``W_img``.
        patch_size: ``P``.

    Returns:
        A Python ``float`` in ``[0, 1]``: blank patches divided by ``B N_p``.

    Raises:
        ValueError: as :func:`patchify` (``images`` not 4-D, ``P`` below 1 or not dividing the
            image), or ``images`` holds no image (``B = 0``).
    """
    patches = patchify(images, patch_size)  # (B, N_p, C_in P^2)
    if patches.shape[0] == 0:
        raise ValueError(f"expected at least one image, got images of shape {tuple(images.shape)}")
    blank = (patches != 0).sum(dim=-1) == 0  # (B, N_p): no non-zero value in the patch
    return blank.double().mean().item()


# --------------------------------------------------------------------------- stretch


def sincos_2d_positions(grid_h: int, grid_w: int, dim: int, cls_token: bool = False) -> torch.Tensor:
    """Fixed 2-D sin-cos position embeddings of a ``grid_h x grid_w`` grid of patches, as in MAE.

    The layout of ``get_2d_sincos_pos_embed`` in MAE (He et al., 2022, "Masked Autoencoders Are Scalable
    Vision Learners"), extended to non-square grids. Patches are numbered row by row: token
    ``n = r grid_w + c`` sits in row ``r`` and column ``c``. Its embedding is two 1-D encodings of
    ``dim / 2`` channels each, **the column's first** (channels ``0 .. dim/2 - 1`` encode ``c``; MAE's
    ``meshgrid(grid_w, grid_h)`` puts ``w`` first), then the row's (``dim/2 .. dim - 1`` encode ``r``).
    Each 1-D encoding of a position ``p`` is split in halves, not interleaved: ``dim / 4`` sines, then the
    ``dim / 4`` cosines of the same angles, ``[sin(p w_0), ..., sin(p w_{dim/4-1}), cos(p w_0), ...]``,
    with frequencies ``w_i = 1 / 10000^(2i / (dim/2))`` for ``i = 0 .. dim/4 - 1``. With ``cls_token`` a
    row of zeros for ``[CLS]`` comes first. The angles are computed in float64 (as MAE does in NumPy) and
    the table is returned as float32. Example: ``sincos_2d_positions(1, 2, 4)`` is
    ``[[0, 1, 0, 1], [sin 1, cos 1, 0, 1]]``: the second patch moved one column, so only the first half
    changed.

    Args:
        grid_h: number of rows of patches, at least 1.
        grid_w: number of columns of patches, at least 1.
        dim: the model width ``C``, a positive multiple of 4.
        cls_token: put a zero row for ``[CLS]`` in front.

    Returns:
        ``(grid_h grid_w, dim)`` float32 tensor, or ``(1 + grid_h grid_w, dim)`` with ``cls_token``; row
        ``1 + n`` (or ``n``) is the embedding of patch ``n``.

    Raises:
        ValueError: ``dim`` is not a positive multiple of 4, or ``grid_h`` or ``grid_w`` is below 1.
    """
    if dim < 4 or dim % 4:
        raise ValueError(
            f"dim must be a positive multiple of 4 (four blocks of dim/4 channels), got dim={dim}"
        )
    if grid_h < 1 or grid_w < 1:
        raise ValueError(f"grid sizes must be at least 1, got grid_h={grid_h} and grid_w={grid_w}")
    quarter = dim // 4
    omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (dim/4,): 2i / (dim/2)
    rows, cols = torch.meshgrid(
        torch.arange(grid_h, dtype=torch.float64), torch.arange(grid_w, dtype=torch.float64), indexing="ij"
    )  # (grid_h, grid_w) each: patch (r, c) holds r and c

    def encode(positions: torch.Tensor) -> torch.Tensor:  # (N,) -> (N, dim/2): sines, then cosines
        angles = positions.reshape(-1, 1) * omega  # (N, dim/4)
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    table = torch.cat([encode(cols), encode(rows)], dim=1)  # (grid_h grid_w, dim): column half, then row half
    if cls_token:
        table = torch.cat([table.new_zeros(1, dim), table], dim=0)  # (1 + grid_h grid_w, dim)
    return table.float()
