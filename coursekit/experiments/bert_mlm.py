"""Chapter 6's experiment: pretraining BERT by masked language modelling, and measuring it.

The model is :mod:`coursekit.bert`; here are its data and its measurements. MLM examples are
``[CLS] w [SEP]`` for random windows ``w`` of BPE tokens of the python-docs training split,
masked afresh each time by :func:`~coursekit.bert.mask_tokens` (:func:`mlm_batch`); the
validation windows and masks are fixed by a seed (:func:`mlm_eval_batches`).
:func:`evaluate_mlm` scores every masked position once, :func:`mlm_baselines` gives the
count-based predictors to beat, and :func:`fill_mask` shows the model's guesses.

:func:`pretrain_bert_small` is the recipe of the book's checkpoint ``bert-small``
(:data:`BERT_SMALL`; ``coursekit pretrain bert-small`` runs it and writes the files, see
:mod:`coursekit.checkpoints`): pretraining starts on short windows, then the encoder is
fine-tuned on the passage classification task of :mod:`coursekit.experiments.topics`.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F

from coursekit import data, train
from coursekit.bert import BERT_PRESETS, BertForMaskedLM, SpecialTokens, mask_tokens, mlm_loss
from coursekit.experiments.topics import accuracy, finetune, logistic_regression_baseline, topic_passages

__all__ = [
    "BERT_SMALL",
    "METRICS",
    "BertRecipe",
    "encode_with_special",
    "evaluate_mlm",
    "fill_mask",
    "mlm_baselines",
    "mlm_batch",
    "mlm_batch_loss",
    "mlm_eval_batches",
    "pretrain_bert_small",
    "selected_logits",
]


# --------------------------------------------------------------------------- masked language modelling


def mlm_batch(
    tokens: torch.Tensor,
    special: SpecialTokens,
    block_size: int,
    batch_size: int,
    vocab_size: int,
    generator: torch.Generator,
    mlm_probability: float = 0.15,
):
    """``batch_size`` random windows of ``block_size`` tokens as ``[CLS] w [SEP]``, masked.

    Returns:
        ``(inputs, labels)``, each ``(B, block_size + 2)`` (see :func:`~coursekit.bert.mask_tokens`).
    """
    if tokens.dim() != 1 or tokens.numel() < block_size:
        raise ValueError(
            f"tokens must be 1-D with at least block_size={block_size} ids, got {tuple(tokens.shape)}"
        )
    offsets = torch.randint(tokens.numel() - block_size + 1, (batch_size,), generator=generator)  # (B,)
    windows = tokens.unfold(0, block_size, 1)[offsets]  # (B, block_size)
    ids = torch.cat(
        [torch.full((batch_size, 1), special.cls), windows, torch.full((batch_size, 1), special.sep)], 1
    )
    return mask_tokens(ids, special, vocab_size, generator, mlm_probability)


def mlm_eval_batches(
    tokens: torch.Tensor,
    special: SpecialTokens,
    block_size: int,
    batch_size: int,
    vocab_size: int,
    n_batches: int,
    seed: int = 0,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of :func:`mlm_batch` batches (windows and masks) drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [mlm_batch(tokens, special, block_size, batch_size, vocab_size, g) for _ in range(n_batches)]


def selected_logits(model: BertForMaskedLM, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``model(inputs)[labels != -100]``, ``(N, V)``, with the MLM head run on those N positions only.

    The head is position-wise, so this is exactly the same as slicing the full logits,
    for about 15% of the head's work (its ``(B, T, V)`` output is the biggest tensor).
    """
    h = model.bert(inputs)  # (B, T, C)
    return model.mlm(h[labels != -100], model.bert.embeddings.token.weight)  # (N, V)


def mlm_batch_loss(model: BertForMaskedLM, batch) -> torch.Tensor:
    """``loss_fn`` for :func:`coursekit.train.train`: :func:`~coursekit.bert.mlm_loss` on a batch
    ``(inputs, labels)``."""
    inputs, labels = batch
    return mlm_loss(selected_logits(model, inputs, labels), labels[labels != -100])


@torch.no_grad()
def evaluate_mlm(model: BertForMaskedLM, batches) -> dict[str, float]:
    """Loss and accuracy over *all* selected positions of ``batches`` (each counts once), in eval mode."""
    was_training = model.training
    model.eval()
    total, correct, n = 0.0, 0, 0
    for inputs, labels in batches:
        logits, target = selected_logits(model, inputs, labels), labels[labels != -100]  # (N, V), (N,)
        total += float(F.cross_entropy(logits, target, reduction="sum"))
        correct += int((logits.argmax(-1) == target).sum())
        n += len(target)
    model.train(was_training)
    return {"loss": total / n, "accuracy": correct / n, "n_masked": n}


def mlm_baselines(
    train_tokens: torch.Tensor, batches, special: SpecialTokens, vocab_size: int
) -> dict[str, float]:
    """Masked-token accuracy of two count-based predictors on the same batches as the model.

    - ``unigram``: always the most frequent training token;
    - ``bigram``: the most frequent training successor of the *original* token on the left
      (an advantage the model does not get: its left neighbour may be masked too); the
      unigram answer when the left token is special or was never seen.

    Also ``unigram_loss``: the cross-entropy of the training unigram distribution
    (add-one smoothed), the loss of a model that ignores the context.
    """
    counts = torch.bincount(train_tokens, minlength=vocab_size).double()  # (V,)
    top = int(counts.argmax())
    pairs = torch.zeros(vocab_size, vocab_size, dtype=torch.long)  # (V, V): count of (left, right)
    pairs.index_put_(
        (train_tokens[:-1], train_tokens[1:]),
        torch.ones(len(train_tokens) - 1, dtype=torch.long),
        accumulate=True,
    )
    best_next = torch.where(pairs.sum(1) > 0, pairs.argmax(1), top)  # (V,)
    best_next[list(special.ids)] = top
    log_p = torch.log((counts + 1) / (counts + 1).sum())  # (V,)
    uni = bi = n = 0
    loss = 0.0
    for inputs, labels in batches:
        original = torch.where(labels != -100, labels, inputs)  # (B, T): where masked, the true token
        sel = labels[:, 1:] != -100  # (B, T - 1): position 0 is always [CLS]
        target = labels[:, 1:][sel]
        uni += int((target == top).sum())
        bi += int((best_next[original[:, :-1][sel]] == target).sum())
        loss -= float(log_p[target].sum())
        n += int(sel.sum())
    return {"unigram": uni / n, "bigram": bi / n, "unigram_loss": loss / n}


# --------------------------------------------------------------------------- text helpers


def encode_with_special(tokenizer, special: SpecialTokens, text: str) -> list[int]:
    """Encode ``text`` in which ``[MASK]`` (and the other names) stand for special tokens.

    Words in our BPE carry their leading space (``" statement"``), so one space before a
    ``[MASK]`` belongs to the masked word: ``"The [MASK] statement"`` has a mask for the
    token after ``"The"``. No ``[CLS]``/``[SEP]`` is added.
    """
    parts = re.split(r"(\[PAD\]|\[CLS\]|\[SEP\]|\[MASK\])", text)
    ids: list[int] = []
    for i, part in enumerate(parts):
        if i % 2:
            ids.append(special.ids[SpecialTokens.NAMES.index(part)])
        else:
            if i + 1 < len(parts) and parts[i + 1] == "[MASK]" and part.endswith(" "):
                part = part[:-1]
            ids.extend(
                tokenizer.encode_ordinary(part)
                if hasattr(tokenizer, "encode_ordinary")
                else tokenizer.encode(part)
            )
    return ids


@torch.no_grad()
def fill_mask(
    model: BertForMaskedLM, tokenizer, special: SpecialTokens, text: str, k: int = 5
) -> list[list[tuple[str, float]]]:
    """The ``k`` most likely tokens (text, probability) at each ``[MASK]`` of ``text``."""
    ids = [special.cls] + encode_with_special(tokenizer, special, text) + [special.sep]
    x = torch.tensor([ids])  # (1, T)
    was_training = model.training
    model.eval()
    probs = model(x)[0].softmax(-1)  # (T, V)
    model.train(was_training)
    out = []
    for t in (x[0] == special.mask).nonzero().flatten().tolist():
        p, top = probs[t].topk(k)
        out.append(
            [(special.name(i) or tokenizer.decode([i]), float(q)) for q, i in zip(p.tolist(), top.tolist())]
        )
    return out


# --------------------------------------------------------------------------- the book's checkpoint


@dataclass(frozen=True)
class BertRecipe:
    """How ``bert-small`` is trained (the arguments of :func:`pretrain_bert_small`).

    Args:
        base_vocab_size: the BPE vocabulary trained on the training split; the four special
            tokens follow it (:meth:`~coursekit.bert.SpecialTokens.after`).
        preset: the :data:`~coursekit.bert.BERT_PRESETS` shape (its ``vocab_size`` is replaced).
        max_steps, batch_size, lr: MLM pretraining (warmup: 5% of the steps; an evaluation
            every 10%).
        short_len, short_fraction: the first ``short_fraction`` of the steps use
            ``short_len``-token inputs.
        finetune_steps, finetune_lr: classifier fine-tuning (warmup: 10% of the steps).
        seed: of the weights, the batches and the fine-tuning.
    """

    base_vocab_size: int = 1024
    preset: str = "small"
    max_steps: int = 5000
    batch_size: int = 32
    lr: float = 3e-3
    short_len: int = 16
    short_fraction: float = 0.5
    finetune_steps: int = 300
    finetune_lr: float = 3e-4
    seed: int = 0

    def shortened(self, steps: int) -> BertRecipe:
        """The same recipe with ``steps`` pretraining steps and a tenth as many fine-tuning steps (a smoke run)."""
        return replace(self, max_steps=steps, finetune_steps=max(1, steps // 10))


#: The committed checkpoint's recipe (``coursekit pretrain bert-small``; about 7 minutes on one thread).
BERT_SMALL = BertRecipe()

#: What :func:`pretrain_bert_small` records.
METRICS = ("train", "validation", "baselines", "finetune")


def pretrain_bert_small(recipe: BertRecipe = BERT_SMALL, progress: bool = True):
    """Pretrain the book's BERT by MLM, fine-tune it, and measure both.

    Like Devlin et al. (2019, appendix A.2), pretraining starts on short inputs: the first
    ``short_fraction`` of the steps use ``short_len``-token inputs (``max_len / short_len``
    times more of them per batch, so every step sees the same number of tokens), the rest
    full ``max_len`` inputs. Attention that starts uniform over 16 tokens gives each
    neighbour a share of 1/16, not 1/64, and learns to read the neighbours much sooner.

    The validation MLM loss and accuracy are measured *with the float16 weights* that are
    stored, on the fixed validation batches (:func:`mlm_eval_batches`, seed 0), beside the
    unigram/bigram baselines on the same masks and the fine-tuned classifier's test
    accuracy beside logistic regression's.

    Returns:
        ``(model, tokenizer, recipe, metrics)``: the trained :class:`~coursekit.bert.BertForMaskedLM`
        (float32 holding the float16-rounded weights that are stored and measured), the BPE tokenizer,
        ``recipe`` and the metrics (:data:`METRICS`).
    """
    r = recipe
    corpus = data.prepare("python-docs", "bpe", vocab_size=r.base_vocab_size)
    special = SpecialTokens.after(corpus.vocab_size)
    config = replace(BERT_PRESETS[r.preset], vocab_size=corpus.vocab_size + 4)
    block = config.max_len - 2
    val = mlm_eval_batches(corpus.val, special, block, 32, config.vocab_size, n_batches=8, seed=0)
    short_len, short_batch = r.short_len, r.batch_size * config.max_len // r.short_len
    val_short = mlm_eval_batches(
        corpus.val, special, short_len - 2, short_batch, config.vocab_size, n_batches=8, seed=0
    )
    n_short = round(r.short_fraction * r.max_steps)
    torch.manual_seed(r.seed)
    model = BertForMaskedLM(config)
    cfg = train.TrainConfig(
        max_steps=r.max_steps,
        batch_size=r.batch_size,
        lr=r.lr,
        warmup_steps=max(1, r.max_steps // 20),
        weight_decay=0.01,
        betas=(0.9, 0.98),
        eval_interval=max(1, r.max_steps // 10),
        seed=r.seed,
    )

    def eval_fn(m):
        v, v_short = evaluate_mlm(m, val), evaluate_mlm(m, val_short)
        return {
            "val_loss": v["loss"],
            "val_accuracy": v["accuracy"],
            f"val_loss_{short_len}": v_short["loss"],
            f"val_accuracy_{short_len}": v_short["accuracy"],
        }

    def batch_fn(step, g):
        if step < n_short:
            return mlm_batch(corpus.train, special, short_len - 2, short_batch, config.vocab_size, g)
        return mlm_batch(corpus.train, special, block, r.batch_size, config.vocab_size, g)

    history = train.train(model, batch_fn, cfg, loss_fn=mlm_batch_loss, eval_fn=eval_fn, progress=progress)
    every = max(1, r.max_steps // 100)
    curve = [
        sum(history.train_loss[i : i + every]) / len(history.train_loss[i : i + every])
        for i in range(0, len(history.train_loss), every)
    ]
    model16 = BertForMaskedLM(config)
    model16.load_state_dict({k: v.to(torch.float16).float() for k, v in model.state_dict().items()})
    val_metrics = evaluate_mlm(model16, val)

    train_data, test_data = topic_passages(corpus.tokenizer, special)
    ft_cfg = train.TrainConfig(
        max_steps=r.finetune_steps,
        batch_size=32,
        lr=r.finetune_lr,
        warmup_steps=max(1, r.finetune_steps // 10),
        weight_decay=0.01,
        eval_interval=r.finetune_steps,
        seed=r.seed,
    )
    t = time.perf_counter()
    clf, _ = finetune(model16.bert, config, train_data, test_data, ft_cfg)
    ft_time = time.perf_counter() - t
    scratch, _ = finetune(None, config, train_data, test_data, ft_cfg)
    majority = float((test_data.labels == torch.bincount(train_data.labels).argmax()).double().mean())
    metrics = {
        "train": {
            **asdict(cfg),
            "steps": len(history.steps),
            "phases": [
                {"steps": n_short, "seq_len": short_len, "batch_size": short_batch},
                {"steps": r.max_steps - n_short, "seq_len": config.max_len, "batch_size": r.batch_size},
            ],
            "wall_time_s": round(history.wall_time, 1),
            "train_time_s": round(history.train_time, 1),
            "tokens_per_s": round(history.tokens_per_s),
            "threads": torch.get_num_threads(),
            "final_train_loss": history.train_loss[-1],
            "evals": history.evals,
            "curve_every": every,
            "train_loss_curve": curve,
            "train_tokens": corpus.train.numel(),
            "val_tokens": corpus.val.numel(),
        },
        "validation": {**val_metrics, "batches": 8, "batch_size": 32, "seed": 0, "weights": "float16"},
        "baselines": mlm_baselines(corpus.train, val, special, config.vocab_size),
        "finetune": {
            "steps": r.finetune_steps,
            "lr": ft_cfg.lr,
            "batch_size": ft_cfg.batch_size,
            "train_passages": len(train_data.labels),
            "test_passages": len(test_data.labels),
            "test_accuracy": accuracy(clf, test_data),
            "from_scratch_test_accuracy": accuracy(scratch, test_data),
            "logistic_regression_test_accuracy": logistic_regression_baseline(train_data, test_data),
            "majority_class_test_accuracy": majority,
            "wall_time_s": round(ft_time, 1),
        },
    }
    return model16, corpus.tokenizer, recipe, metrics
