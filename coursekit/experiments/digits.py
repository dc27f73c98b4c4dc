"""Chapter 9's experiment: a small ViT against a CNN and scikit-learn on the 8x8 digits.

**Data.** scikit-learn's bundled 8x8 digits (1,797 images, no download), scaled to ``[0, 1]``,
split 80/20 stratified with ``random_state=0`` (:func:`digits_split`); training batches are
shifted by a pixel or so (:func:`random_shift`).

**Training.** :func:`fit_classifier` trains any image classifier (the
:class:`~coursekit.vit.ViT`, or the baseline :class:`SmallCNN`) with
:func:`coursekit.train.train` and one of the book's :data:`DIGITS_RECIPES`;
:func:`sklearn_baselines` gives logistic regression's and an SVM's test accuracy.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from coursekit import train

__all__ = [
    "DigitsSplit",
    "digits_split",
    "random_shift",
    "Recipe",
    "DIGITS_RECIPES",
    "predict",
    "accuracy",
    "fit_classifier",
    "SmallCNN",
    "sklearn_baselines",
]


# --------------------------------------------------------------------------- data


class DigitsSplit(NamedTuple):
    """The digits split: images ``(n, 1, 8, 8)`` float32 in ``[0, 1]``, labels ``(n,)`` long."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def digits_split(test_size: float = 0.2, random_state: int = 0) -> DigitsSplit:
    """scikit-learn's 8x8 digits (bundled, no download), split stratified by class.

    The images' 17 grey levels ``0 .. 16`` are scaled to ``[0, 1]``. With the defaults
    1,437 images train and 360 test, each class in the same proportion in both.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (1797, 1, 8, 8)
    y = torch.tensor(digits.target, dtype=torch.long)  # (1797,)
    train_i, test_i = train_test_split(
        torch.arange(len(y)).numpy(), test_size=test_size, stratify=y.numpy(), random_state=random_state
    )
    train_i, test_i = torch.as_tensor(train_i), torch.as_tensor(test_i)
    return DigitsSplit(x[train_i], y[train_i], x[test_i], y[test_i])


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by its own random whole number of pixels in ``[-max_shift, max_shift]``
    along each axis; pixels that move in from outside are 0.

    Args:
        images: ``(B, C_in, H_img, W_img)``.
        max_shift: the largest shift, ``>= 0`` (0 returns the images unchanged).
        generator: the source of the shifts.

    Returns:
        ``(B, C_in, H_img, W_img)``.
    """
    if max_shift < 0:
        raise ValueError(f"max_shift must be >= 0, got {max_shift}")
    if max_shift == 0:
        return images
    B, C_in, H_img, W_img = images.shape
    s = max_shift
    padded = F.pad(images, (s, s, s, s))  # (B, C_in, H_img + 2s, W_img + 2s)
    dy = torch.randint(0, 2 * s + 1, (B,), generator=generator)  # (B,): top row of the crop
    dx = torch.randint(0, 2 * s + 1, (B,), generator=generator)  # (B,)
    rows = dy[:, None] + torch.arange(H_img)  # (B, H_img)
    cols = dx[:, None] + torch.arange(W_img)  # (B, W_img)
    b = torch.arange(B)[:, None, None]  # (B, 1, 1)
    out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]  # (B, H_img, W_img, C_in)
    return out.permute(0, 3, 1, 2)  # (B, C_in, H_img, W_img)


# --------------------------------------------------------------------------- training


class Recipe(NamedTuple):
    """How a classifier is trained on the digits by :func:`fit_classifier`."""

    train: train.TrainConfig
    max_shift: int = 1
    label_smoothing: float = 0.0


#: The book's recipes on the digits split. The ViT's was chosen on a validation split of the
#: training images (the last 20%, stratified, ``random_state=0``), never on the test images,
#: to fit about 90 s of training on one CPU thread; the CNN's was set once and not tuned.
DIGITS_RECIPES = {
    "vit": Recipe(
        train.TrainConfig(
            max_steps=2000,
            batch_size=128,
            lr=1e-3,
            min_lr_ratio=0.0,
            warmup_steps=100,
            weight_decay=0.05,
            betas=(0.9, 0.999),
            eval_interval=250,
        ),
        max_shift=1,
        label_smoothing=0.1,
    ),
    "cnn": Recipe(
        train.TrainConfig(
            max_steps=1000,
            batch_size=64,
            lr=1e-3,
            min_lr_ratio=0.0,
            warmup_steps=100,
            weight_decay=0.05,
            betas=(0.9, 0.999),
            eval_interval=200,
        ),
        max_shift=1,
        label_smoothing=0.0,
    ),
}


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """The predicted class ``(n,)`` of each image, in eval mode (the mode is restored)."""
    was_training = model.training
    model.eval()
    try:
        return torch.cat(
            [model(images[i : i + batch_size]).argmax(-1) for i in range(0, len(images), batch_size)]
        )
    finally:
        model.train(was_training)


def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of ``images`` whose predicted class is ``labels``."""
    return float((predict(model, images) == labels).double().mean())


def fit_classifier(
    model: nn.Module,
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    cfg: train.TrainConfig,
    *,
    max_shift: int = 1,
    label_smoothing: float = 0.0,
    eval_data: tuple[torch.Tensor, torch.Tensor] | None = None,
    progress: bool = False,
) -> train.History:
    """Train an image classifier with :func:`coursekit.train.train`.

    Each step draws ``cfg.batch_size`` training images at random (with replacement),
    shifts each by up to ``max_shift`` pixels (:func:`random_shift`) and minimises the
    cross-entropy with ``label_smoothing``. With ``eval_data = (x, y)`` the accuracy on it
    is recorded as ``accuracy`` at every ``cfg.eval_interval`` steps (it is not used to
    choose anything).
    """
    n = len(train_y)

    def batch_fn(step, g):
        i = torch.randint(n, (cfg.batch_size,), generator=g)  # (B,)
        return random_shift(train_x[i], max_shift, g), train_y[i]

    def loss_fn(m, batch):
        x, y = batch
        return F.cross_entropy(m(x), y, label_smoothing=label_smoothing)

    eval_fn = None if eval_data is None else (lambda m: {"accuracy": accuracy(m, *eval_data)})
    return train.train(model, batch_fn, cfg, loss_fn=loss_fn, eval_fn=eval_fn, progress=progress)


# --------------------------------------------------------------------------- baselines


class SmallCNN(nn.Module):
    """A small convolutional network for 8x8 digits, the baseline with the image prior built in.

    ``conv 3x3 (C_in -> w) - ReLU - conv 3x3 (w -> 2w) - ReLU - max-pool 2x2 - linear (32 w -> 128)
    - ReLU - linear (128 -> K)``; the convolutions are padded, so the pooled map is 4x4.

    Args:
        in_channels: ``C_in``.
        n_classes: ``K``.
        width: ``w``, the first convolution's channels.
    """

    def __init__(self, in_channels: int = 1, n_classes: int = 10, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * width * 16, 128), nn.ReLU(), nn.Linear(128, n_classes)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, 8, 8) -> (B, K)`` logits."""
        return self.classifier(self.features(images))  # (B, 2w, 4, 4) -> (B, K)


def sklearn_baselines(split: DigitsSplit, svm_gamma: float = 0.001) -> dict[str, float]:
    """Test accuracies of scikit-learn's logistic regression and RBF-kernel SVM on ``split``.

    Both read the 64 pixels as a vector with the dataset's own grey levels ``0 .. 16``, as
    scikit-learn's digits example does (``SVC(gamma=0.001)`` is that example's setting);
    nothing is tuned on the test set.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    x_train = (split.train_x.reshape(len(split.train_y), -1) * 16).numpy()  # (n, 64), grey levels 0 .. 16
    x_test = (split.test_x.reshape(len(split.test_y), -1) * 16).numpy()
    y_train, y_test = split.train_y.numpy(), split.test_y.numpy()
    models = {
        "logistic regression": LogisticRegression(max_iter=5000),
        f"SVM (RBF, gamma={svm_gamma:g})": SVC(gamma=svm_gamma),
    }
    return {
        name: float((m.fit(x_train, y_train).predict(x_test) == y_test).mean()) for name, m in models.items()
    }
