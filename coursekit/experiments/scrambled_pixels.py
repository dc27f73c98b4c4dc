"""Chapter 9's scrambled-pixels experiment: which network's prior does a fixed scramble break?

**The scramble.** One fixed permutation of the ``P^2`` pixel positions of a ``P x P`` patch
(``P`` = the small ViT's patch size, 4) is applied inside every patch of every image, training
and test alike (:func:`scramble`). Nothing is lost (the permutation can be undone), but a pixel's
neighbours inside its patch are no longer its neighbours in the picture. The permutation has no
fixed point (every pixel moves) and depends on the seed only (:func:`permutation`).

**Runs.** The chapter's CNN and ViT train on all 1,437 training digits, plain and scrambled,
with :func:`coursekit.experiments.data_scale.recipe` (the chapter's recipes compressed to the same
500 updates), and are tested on the 360 test digits, scrambled the same way. The scramble sits in
front of the network (:class:`Scrambled`), after the training shifts, as if the camera scrambled
its pixels. Seed ``s`` fixes the permutation, the initial weights and the batches and shifts, so a
seed's plain and scrambled runs draw the same batches.

**The pairing of the ViT's runs.** The ViT reads a patch through one linear map of its ``P^2``
pixels, whose initial weights are drawn independently for each input, so every relabelling of
its inputs is as likely as another. A scrambled ViT therefore starts from the plain run's initial
weights with the patch embedding's inputs relabelled by the same permutation
(:func:`relabel_patch_inputs`): it computes the plain network's function on the unscrambled
image, and the two runs differ only in the order of floating-point sums. The CNN has no such
relabelling (its 3x3 filters are shared across patch borders), so its scrambled run starts from
its seed's ordinary initial weights.

``python -m coursekit.experiments.scrambled_pixels`` runs both models, plain and scrambled, for
every seed of :data:`SEEDS` (12 runs, about five minutes on one thread) and rewrites
:data:`RESULTS`, which Chapter 9's exercise reads (``predict_scrambled_pixels``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from coursekit.experiments import data_scale, digits
from coursekit.experiments._results import CommittedResults
from coursekit.vit import VIT_PRESETS, ViT, patchify, unpatchify

__all__ = [
    "MODELS",
    "PATCH",
    "RESULTS",
    "SEEDS",
    "VARIANTS",
    "Scrambled",
    "load_results",
    "permutation",
    "relabel_patch_inputs",
    "run_all",
    "scramble",
    "settings",
    "train_run",
]

SEEDS = (0, 1, 2)
MODELS = data_scale.MODELS  #: ("cnn", "vit"), as in the data-scale sweep
VARIANTS = ("plain", "scrambled")
PATCH = VIT_PRESETS["small"].patch_size  #: the scramble's patch side: the ViT's patches, 4 pixels
RESULTS = Path(__file__).with_name("scrambled_pixels_results.json")
_COMMITTED = CommittedResults(
    module="coursekit.experiments.scrambled_pixels",
    path=RESULTS,
    fmt="coursekit-scrambled-pixels",
    version=1,
    what="stored scrambled-pixels experiment",
    seeds=SEEDS,
)


def permutation(seed: int, patch: int = PATCH) -> torch.Tensor:
    """A random permutation of the ``patch^2`` pixel positions of a patch (numbered row by row)
    with no fixed point, drawn by a generator seeded ``seed``: pixel ``perm[k]`` of each patch of
    the image becomes pixel ``k`` of the scrambled patch.

    Raises:
        ValueError: ``patch`` is below 2 (a single pixel cannot move).
    """
    if not isinstance(patch, int) or patch < 2:
        raise ValueError(f"patch must be an integer >= 2, got {patch!r}")
    g = torch.Generator().manual_seed(seed)
    identity = torch.arange(patch * patch)
    while True:  # about e = 2.7 draws on average
        perm = torch.randperm(patch * patch, generator=g)
        if not bool((perm == identity).any()):
            return perm


def scramble(images: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Move the pixels inside every ``P x P`` patch of ``images`` by ``perm``.

    ``out[b, c, P r + i, P s + j] = images[b, c, P r + k // P, P s + k % P]`` with ``k = perm[P i + j]``:
    every patch (tiled from the top left corner) keeps its pixels, in another order.

    Args:
        images: ``(B, C_in, H_img, W_img)``, both sides multiples of ``P``.
        perm: ``(P^2,)`` a permutation of ``0 .. P^2 - 1``.

    Returns:
        ``(B, C_in, H_img, W_img)``.

    Raises:
        ValueError: ``perm`` is not a permutation of a square's positions, or ``images`` is not
            4-D with sides divisible by ``P``.
    """
    n = perm.numel()
    P = round(n**0.5)
    if perm.dim() != 1 or P * P != n or not torch.equal(torch.sort(perm).values, torch.arange(n)):
        raise ValueError(f"perm must be a permutation of 0 .. P^2 - 1 for some P, got {perm.tolist()}")
    if images.dim() != 4 or images.shape[-2] % P or images.shape[-1] % P:
        raise ValueError(
            f"images must be (B, C_in, H, W) with H and W multiples of {P}, got {tuple(images.shape)}"
        )
    patches = patchify(images, P)[
        ..., _patch_index(perm, images.shape[1]).to(images.device)
    ]  # (B, N_p, C_in P^2)
    return unpatchify(patches, P, tuple(images.shape[-2:]))


def _patch_index(perm: torch.Tensor, in_channels: int) -> torch.Tensor:
    """``(C_in P^2,)``: where each value of a scrambled patch comes from in the plain patch, both in
    :func:`~coursekit.vit.patchify`'s ``(c, i, j)`` order: value ``(c, k)`` is value ``(c, perm[k])``."""
    n = perm.numel()
    return (torch.arange(in_channels)[:, None] * n + perm[None, :]).flatten()


class Scrambled(nn.Module):
    """``net`` behind a fixed scramble: ``forward(images) = net(scramble(images, perm))``."""

    def __init__(self, net: nn.Module, perm: torch.Tensor):
        super().__init__()
        self.net = net
        self.register_buffer("perm", perm.clone(), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(scramble(images, self.perm))


def relabel_patch_inputs(net: ViT, perm: torch.Tensor) -> None:
    """Relabel the inputs of ``net``'s patch embedding in place so that, on scrambled images, it
    computes what it computed on the plain ones: ``net(scramble(x, perm))`` after equals ``net(x)``
    before, up to the order of floating-point sums.

    The embedding is ``proj(patch)``, a linear map of a patch's ``C_in P^2`` values in the order
    ``(c, i, j)``; input ``(c, k)`` of the scrambled patch is input ``(c, perm[k])`` of the plain
    one, so its weight column moves with it.
    """
    proj = net.patch_embed.proj
    with torch.no_grad():
        proj.weight.copy_(proj.weight[:, _patch_index(perm, net.cfg.in_channels)])


def train_run(model: str, variant: str, seed: int, split: digits.DigitsSplit | None = None) -> dict:
    """Train ``model`` (``"cnn"`` or ``"vit"``) on all training digits, ``variant`` ``"plain"`` or
    ``"scrambled"`` (by :func:`permutation` ``(seed)``), with the data-scale sweep's recipe.

    Returns:
        ``{"permutation": the scramble's permutation as a list (None for a plain run), "final_loss":
        the last step's training loss, "train_accuracy": on the training digits (unshifted),
        "test_accuracy": on the test digits}``, floats rounded to 6 decimals, each measured through
        the run's scramble.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {list(VARIANTS)}, got {variant!r}")
    split = split if split is not None else digits.digits_split()
    r = data_scale.recipe(model)
    torch.manual_seed(seed)  # the initial weights, the same for both variants
    net = data_scale.make_model(model)
    perm = permutation(seed) if variant == "scrambled" else None
    if perm is not None:
        if model == "vit":
            relabel_patch_inputs(net, perm)
        net = Scrambled(net, perm)
    history = digits.fit_classifier(
        net,
        split.train_x,
        split.train_y,
        replace(r.train, seed=seed),  # the batches and shifts, the same for both variants
        max_shift=r.max_shift,
        label_smoothing=r.label_smoothing,
    )
    return {
        "permutation": None if perm is None else perm.tolist(),
        "final_loss": round(history.train_loss[-1], 6),
        "train_accuracy": round(digits.accuracy(net, split.train_x, split.train_y), 6),
        "test_accuracy": round(digits.accuracy(net, split.test_x, split.test_y), 6),
    }


def settings() -> dict:
    """What a stored result depends on besides the code: the data-scale sweep's settings (recipes,
    steps, parameter counts) and the patch (each scrambled run stores its permutation)."""
    base = data_scale.settings()
    return {
        "models": list(MODELS),
        "variants": list(VARIANTS),
        "steps": base["steps"],
        "recipes": base["recipes"],
        "params": base["params"],
        "patch": PATCH,
    }


def run_all(seeds=SEEDS) -> dict[str, dict[str, list[dict]]]:
    """``{model: {variant: [train_run(model, variant, s) for s in seeds]}}``."""
    split = digits.digits_split()
    return {m: {v: [train_run(m, v, s, split) for s in seeds] for v in VARIANTS} for m in MODELS}


def load_results(path: str | Path = RESULTS) -> dict:
    """The stored runs: ``{"seeds": [...], "settings": settings(), "runs": {model: {variant: [run per
    seed]}}}``, each run as :func:`train_run` returns it.

    Raises:
        ValueError: if the file was written with other settings than the code's (rerun
            ``python -m coursekit.experiments.scrambled_pixels``).
    """
    return _COMMITTED.read(
        path,
        settings=settings(),
        layout_ok=lambda data: (
            list(data["runs"]) == list(MODELS)
            and all(
                list(per_variant) == list(VARIANTS)
                and all(len(runs) == len(data["seeds"]) for runs in per_variant.values())
                for per_variant in data["runs"].values()
            )
        ),
    )


def main(argv: list[str] | None = None) -> None:
    _COMMITTED.main(
        argv,
        "Rerun Chapter 9's scrambled-pixels experiment: the CNN and the ViT on plain and on scrambled digits.",
        lambda args: {"settings": settings(), "runs": run_all(args.seeds)},
    )


if __name__ == "__main__":
    main()
