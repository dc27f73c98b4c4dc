"""Wrong implementations for Exercise 6 (BERT), each a mistake students really make."""

from coursekit import bert as ref
from tests.mutants import Mutant, mutant

MUTANTS = [
    Mutant(
        "emb_no_segment",
        "BertEmbeddings",
        "BertEmbeddings",
        "the segment embedding is missing",
        """
class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, max_len, d_model, n_segments=2, dropout=0.1, eps=1e-12):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(n_segments, d_model)
        self.norm = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids, token_type_ids=None):
        T = input_ids.shape[1]
        x = self.token(input_ids) + self.position(torch.arange(T))
        return self.dropout(self.norm(x))
""",
    ),
    Mutant(
        "emb_no_norm",
        "BertEmbeddings",
        "BertEmbeddings",
        "the layer norm is missing",
        """
class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, max_len, d_model, n_segments=2, dropout=0.1, eps=1e-12):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(n_segments, d_model)
        self.norm = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        T = input_ids.shape[1]
        return self.dropout(self.token(input_ids) + self.position(torch.arange(T)) + self.segment(token_type_ids))
""",
    ),
    Mutant(
        "emb_positions_from_one",
        "BertEmbeddings",
        "BertEmbeddings",
        "positions start at 0",
        """
class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, max_len, d_model, n_segments=2, dropout=0.1, eps=1e-12):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.segment = nn.Embedding(n_segments, d_model)
        self.norm = LayerNorm(d_model, eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids, token_type_ids=None):
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        T = input_ids.shape[1]
        x = self.token(input_ids) + self.position(torch.arange(1, T + 1)) + self.segment(token_type_ids)
        return self.dropout(self.norm(x))
""",
    ),
    Mutant(
        "mask_selects_specials",
        "mask_tokens",
        "mask_tokens",
        "were selected: never select a special token",
        """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    selected = torch.rand(input_ids.shape, generator=generator) < mlm_probability
    labels = torch.where(selected, input_ids, -100)
    action = torch.rand(input_ids.shape, generator=generator)
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
""",
    ),
    Mutant(
        "mask_always_mask",
        "mask_tokens",
        "mask_tokens",
        "every selected position became [MASK]",
        """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    is_special = torch.isin(input_ids, torch.tensor(special.ids))
    selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~is_special
    labels = torch.where(selected, input_ids, -100)
    return torch.where(selected, special.mask, input_ids), labels
""",
    ),
    Mutant(
        "mask_random_from_whole_vocab",
        "mask_tokens",
        "mask_tokens",
        "draw random tokens from the ordinary ids only",
        """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    is_special = torch.isin(input_ids, torch.tensor(special.ids))
    selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~is_special
    labels = torch.where(selected, input_ids, -100)
    action = torch.rand(input_ids.shape, generator=generator)
    random_ids = torch.randint(vocab_size, input_ids.shape, generator=generator)
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
""",
    ),
    Mutant(
        "mask_random_below_vocab_minus_4",
        "mask_tokens",
        "mask_tokens",
        "draw random tokens from the ordinary ids only",
        """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    is_special = torch.isin(input_ids, torch.tensor(special.ids))
    selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~is_special
    labels = torch.where(selected, input_ids, -100)
    action = torch.rand(input_ids.shape, generator=generator)
    random_ids = torch.randint(vocab_size - 4, input_ids.shape, generator=generator)  # assumes specials come last
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
""",
    ),
    Mutant(
        "mask_labels_everywhere",
        "mask_tokens",
        "mask_tokens",
        "labels must be -100 at every position",
        """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    is_special = torch.isin(input_ids, torch.tensor(special.ids))
    selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~is_special
    labels = input_ids.clone()
    action = torch.rand(input_ids.shape, generator=generator)
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
""",
    ),
    Mutant(
        "mask_inverted_rate",
        "mask_tokens",
        "mask_tokens",
        "expected about 15%",
        """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    is_special = torch.isin(input_ids, torch.tensor(special.ids))
    selected = (torch.rand(input_ids.shape, generator=generator) > mlm_probability) & ~is_special
    labels = torch.where(selected, input_ids, -100)
    action = torch.rand(input_ids.shape, generator=generator)
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
""",
    ),
    Mutant(
        "mask_ignores_probability",
        "mask_tokens",
        "mask_tokens",
        "with mlm_probability=0.4",
        """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    is_special = torch.isin(input_ids, torch.tensor(special.ids))
    selected = (torch.rand(input_ids.shape, generator=generator) < 0.15) & ~is_special
    labels = torch.where(selected, input_ids, -100)
    action = torch.rand(input_ids.shape, generator=generator)
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
""",
    ),
    Mutant(
        "mask_global_rng",
        "mask_tokens",
        "mask_tokens",
        "generator=generator",
        """
def mask_tokens(input_ids, special, vocab_size, generator, mlm_probability=0.15):
    is_special = torch.isin(input_ids, torch.tensor(special.ids))
    selected = (torch.rand(input_ids.shape) < mlm_probability) & ~is_special
    labels = torch.where(selected, input_ids, -100)
    action = torch.rand(input_ids.shape)
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special.ids])
    random_ids = ordinary[torch.randint(len(ordinary), input_ids.shape)]
    inputs = torch.where(selected & (action < 0.8), special.mask, input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels
""",
    ),
    Mutant(
        "loss_over_all_positions",
        "mlm_loss",
        "mlm_loss",
        "averaged over all positions",
        """
def mlm_loss(logits, labels):
    if not (labels != -100).any():
        raise ValueError("no position is selected")
    V = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100, reduction="sum")
    return ce / labels.numel()
""",
    ),
    Mutant(
        "loss_unselected_as_token_0",
        "mlm_loss",
        "mlm_loss",
        "unselected positions (label -100) count",
        """
def mlm_loss(logits, labels):
    if not (labels != -100).any():
        raise ValueError("no position is selected")
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), labels.clamp(min=0).reshape(-1))
""",
    ),
    Mutant(
        "loss_no_empty_check",
        "mlm_loss",
        "mlm_loss",
        "say that no position is selected",
        """
def mlm_loss(logits, labels):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
""",
    ),
    Mutant(
        "cls_last_token",
        "ClsHead",
        "ClsHead",
        "you pooled the last position",
        """
class ClsHead(nn.Module):
    def __init__(self, d_model, n_classes, dropout=0.1):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, n_classes)

    def forward(self, hidden):
        return self.classifier(self.dropout(torch.tanh(self.pooler(hidden[:, -1]))))
""",
    ),
    Mutant(
        "cls_no_tanh",
        "ClsHead",
        "ClsHead",
        "the tanh is missing",
        """
class ClsHead(nn.Module):
    def __init__(self, d_model, n_classes, dropout=0.1):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, n_classes)

    def forward(self, hidden):
        return self.classifier(self.dropout(self.pooler(hidden[:, 0])))
""",
    ),
    Mutant(
        "cls_mean_pool",
        "ClsHead",
        "ClsHead",
        "you averaged over the positions",
        """
class ClsHead(nn.Module):
    def __init__(self, d_model, n_classes, dropout=0.1):
        super().__init__()
        self.pooler = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, n_classes)

    def forward(self, hidden):
        return self.classifier(self.dropout(torch.tanh(self.pooler(hidden.mean(dim=1)))))
""",
    ),
    # ----------------------------------------------------------------- clauses the graders did not check before
    mutant(
        "emb_dropout_before_norm",
        ref.BertEmbeddings,
        "the dropout comes before the norm",
        ("return self.dropout(self.norm(x))", "return self.norm(self.dropout(x))"),
    ),
    mutant(
        "emb_dropout_fixed_p",
        ref.BertEmbeddings,
        "dropout.p should be the dropout argument",
        ("self.dropout = nn.Dropout(dropout)", "self.dropout = nn.Dropout(0.1)"),
    ),
    mutant(
        "emb_norm_default_eps",
        ref.BertEmbeddings,
        "the norm's eps should be",
        ("self.norm = LayerNorm(d_model, eps)", "self.norm = LayerNorm(d_model)"),
    ),
    mutant(
        "emb_no_length_check",
        ref.BertEmbeddings,
        "raise a ValueError instead",
        (
            "        if T > self.position.num_embeddings:\n            raise ValueError(",
            "        if False:\n            raise ValueError(",
        ),
    ),
    mutant(
        "emb_positions_on_the_default_device",
        ref.BertEmbeddings,
        "torch.arange(T, device=input_ids.device)",
        ("positions = torch.arange(T, device=input_ids.device)", "positions = torch.arange(T)"),
    ),
    mutant(
        "mask_selects_mask_tokens",
        ref.mask_tokens,
        "were selected: never select a special token",
        (
            "torch.isin(input_ids, torch.tensor(special.ids))",
            "torch.isin(input_ids, torch.tensor(special.ids[:3]))",
        ),
    ),
    mutant(
        "mask_in_place",
        ref.mask_tokens,
        "changed its input_ids in place",
        ("    return inputs, labels", "    input_ids.copy_(inputs)\n    return inputs, labels"),
    ),
    mutant(
        "mask_random_skips_an_id",
        ref.mask_tokens,
        "should be uniform over the",
        (
            "ordinary[torch.randint(len(ordinary), input_ids.shape, generator=generator)]",
            "ordinary[torch.randint(1, len(ordinary), input_ids.shape, generator=generator)]",
        ),
    ),
    mutant(
        "mask_returns_its_input_when_nothing_is_selected",
        ref.mask_tokens,
        "shares memory with an input",
        (
            "    labels = torch.where(selected, input_ids, -100)  # (B, T)\n",
            "    if not selected.any():\n        return input_ids, torch.full_like(input_ids, -100)\n"
            "    labels = torch.where(selected, input_ids, -100)  # (B, T)\n",
        ),
    ),
    mutant(
        "loss_unstable",
        ref.mlm_loss,
        "compute the log-softmax stably",
        (
            "return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)",
            "return F.nll_loss(torch.log(torch.softmax(logits.reshape(-1, V), -1)), labels.reshape(-1))",
        ),
    ),
    mutant(
        "loss_no_shape_check",
        ref.mlm_loss,
        "say that labels must have the shape (2, 3)",
        ("    if logits.shape[:-1] != labels.shape:\n        raise", "    if False:\n        raise"),
    ),
    mutant(
        "loss_shape_error_without_shapes",
        ref.mlm_loss,
        "should name the expected shape (2, 3)",
        ('without its last axis, {tuple(logits.shape[:-1])}, "', 'without its last axis"'),
        ('f"got {tuple(labels.shape)}"\n        )', '""\n        )'),
    ),
    mutant(
        "loss_in_float64",
        ref.mlm_loss,
        "of the logits' dtype float32",
        (
            "return F.cross_entropy(logits.reshape(-1, V),",
            "return F.cross_entropy(logits.double().reshape(-1, V),",
        ),
    ),
    mutant(
        "cls_dropout_after_classifier",
        ref.ClsHead,
        "the dropout belongs before the classifier",
        ("return self.classifier(self.dropout(pooled))", "return self.dropout(self.classifier(pooled))"),
    ),
    mutant(
        "cls_dropout_fixed_p",
        ref.ClsHead,
        "dropout.p should be the dropout argument",
        ("self.dropout = nn.Dropout(dropout)", "self.dropout = nn.Dropout(0.1)"),
    ),
    Mutant(
        "random_share_forgets_selection",
        "predict_random_share",
        "predict_random_share",
        "the experiment gives",
        "predict_random_share = 10\n",
    ),
    Mutant(
        "random_share_as_fraction",
        "predict_random_share",
        "predict_random_share",
        "you predicted 0.015",
        "predict_random_share = 0.015\n",
    ),
    Mutant(
        "random_share_as_text",
        "predict_random_share",
        "predict_random_share",
        "should be a finite number",
        'predict_random_share = "1.5%"\n',
    ),
    Mutant(
        "head_untied",
        "predict_mlm_head_params",
        "predict_mlm_head_params",
        "the experiment gives (b) about 0.6 million",
        'predict_mlm_head_params = "d"\n',
    ),
    Mutant(
        "head_bias_only",
        "predict_mlm_head_params",
        "predict_mlm_head_params",
        "you predicted (a) about 30 thousand",
        'predict_mlm_head_params = "a"\n',
    ),
    Mutant(
        "head_not_a_letter",
        "predict_mlm_head_params",
        "predict_mlm_head_params",
        "one of the letters",
        "predict_mlm_head_params = 622650\n",
    ),
    Mutant(
        "same_topic_thinks_topic_unused",
        "predict_same_topic_negatives",
        "predict_same_topic_negatives",
        "you predicted (a) about as high",
        'predict_same_topic_negatives = "a"\n',
    ),
    Mutant(
        "same_topic_thinks_topic_is_everything",
        "predict_same_topic_negatives",
        "predict_same_topic_negatives",
        "the experiment gives (b) clearly above chance",
        'predict_same_topic_negatives = "c"\n',
    ),
    Mutant(
        "same_topic_thinks_it_gets_easier",
        "predict_same_topic_negatives",
        "predict_same_topic_negatives",
        "you predicted (d) higher",
        'predict_same_topic_negatives = "d"\n',
    ),
    Mutant(
        "same_topic_as_a_number",
        "predict_same_topic_negatives",
        "predict_same_topic_negatives",
        "one of the letters",
        "predict_same_topic_negatives = 0.7\n",
    ),
    mutant(
        "corrupted_counts_selected",
        ref.corrupted_fraction,
        "kept tokens did not",
        ("inputs, _ = mask_tokens(", "inputs, labels = mask_tokens("),
        ("changed = (inputs != input_ids) & ordinary", "changed = (labels != -100) & ordinary"),
    ),
    mutant(
        "corrupted_counts_masks_only",
        ref.corrupted_fraction,
        "count the ordinary positions whose token changed",
        ("changed = (inputs != input_ids) & ordinary", "changed = (inputs == special.mask) & ordinary"),
    ),
    mutant(
        "corrupted_all_positions",
        ref.corrupted_fraction,
        "not of all positions",
        ("return (changed.sum() / ordinary.sum()).item()", "return changed.double().mean().item()"),
    ),
    mutant(
        "corrupted_returns_tensor",
        ref.corrupted_fraction,
        "should return a Python float",
        ("return (changed.sum() / ordinary.sum()).item()", "return changed.sum() / ordinary.sum()"),
    ),
    mutant(
        "corrupted_global_rng",
        ref.corrupted_fraction,
        "pass the generator",
        (
            "inputs, _ = mask_tokens(input_ids, special, vocab_size, generator, mlm_probability)",
            "inputs, _ = mask_tokens(input_ids, special, vocab_size, torch.Generator(), mlm_probability)",
        ),
    ),
    mutant(
        "corrupted_default_rate",
        ref.corrupted_fraction,
        "mlm_probability",
        (
            "inputs, _ = mask_tokens(input_ids, special, vocab_size, generator, mlm_probability)",
            "inputs, _ = mask_tokens(input_ids, special, vocab_size, generator)",
        ),
    ),
    mutant(
        "corrupted_no_validation",
        ref.corrupted_fraction,
        "raise a ValueError",
        ("    if not ordinary.any():\n", "    if False:\n"),
    ),
    mutant(
        "corrupted_averages_two_runs",
        ref.corrupted_fraction,
        "inside the band, so the procedure differs",
        (
            "    changed = (inputs != input_ids) & ordinary  # (B, T)\n"
            "    return (changed.sum() / ordinary.sum()).item()",
            "    again, _ = mask_tokens(input_ids, special, vocab_size, generator, mlm_probability)\n"
            "    changed = ((inputs != input_ids) & ordinary).sum() + ((again != input_ids) & ordinary).sum()\n"
            "    return (changed / (2 * ordinary.sum())).item()",
        ),
    ),
    mutant(
        "wwm_token_selection",
        ref.mask_whole_words,
        "selected only in part",
        (
            "selected = chosen.gather(1, word_ids.long().clamp(min=0)) & ~is_special",
            "selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~is_special",
        ),
    ),
    mutant(
        "wwm_token_then_word",
        ref.mask_whole_words,
        "no likelier than a short one",
        (
            "selected = chosen.gather(1, word_ids.long().clamp(min=0)) & ~is_special",
            "hit = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~is_special\n"
            "    chosen = torch.zeros_like(chosen).scatter_reduce(1, word_ids.long().clamp(min=0), hit, 'amax')\n"
            "    selected = chosen.gather(1, word_ids.long().clamp(min=0)) & ~is_special",
        ),
    ),
    mutant(
        "wwm_action_per_word",
        ref.mask_whole_words,
        "one draw per token",
        (
            "action = torch.rand(input_ids.shape, generator=generator)",
            "action = torch.rand(chosen.shape, generator=generator).gather(1, word_ids.long().clamp(min=0))",
        ),
    ),
    mutant(
        "wwm_shared_rows",
        ref.mask_whole_words,
        "of each row",
        (
            "chosen = torch.rand((B, max(n_words, 1)), generator=generator) < mlm_probability",
            "chosen = (torch.rand((1, max(n_words, 1)), generator=generator) < mlm_probability).expand(B, -1)",
        ),
    ),
    mutant(
        "wwm_specials_selected",
        ref.mask_whole_words,
        "never select a special token",
        (
            "selected = chosen.gather(1, word_ids.long().clamp(min=0)) & ~is_special",
            "selected = chosen.gather(1, word_ids.long().clamp(min=0))",
        ),
    ),
    mutant(
        "wwm_no_rate_check",
        ref.mask_whole_words,
        "with mlm_probability=-0.1",
        ("    if not 0 <= mlm_probability <= 1:\n", "    if False:\n"),
    ),
    mutant(
        "wwm_returns_its_input_when_nothing_is_selected",
        ref.mask_whole_words,
        "shares memory with an input",
        (
            "    labels = torch.where(selected, input_ids, -100)  # (B, T)\n",
            "    if not selected.any():\n        return input_ids, torch.full_like(input_ids, -100)\n"
            "    labels = torch.where(selected, input_ids, -100)  # (B, T)\n",
        ),
    ),
    mutant(
        "wwm_no_word_id_check",
        ref.mask_whole_words,
        "word id -1 at the ordinary token",
        ("    if not torch.equal(word_ids < 0, is_special):\n", "    if False:\n"),
    ),
]

#: Generated mutants (``scripts/mutation.py``) that no input the text allows tells apart from the answer.
_DRAW = (
    "a float32 uniform draw equals the threshold exactly with probability at most 2**-24, so the rule's "
    "probabilities do not change; the text specifies probabilities, not a random stream"
)
EQUIVALENT: dict[str, str] = {
    "BertEmbeddings | T = input_ids.shape[1] | number | 2": (
        "input_ids is (B, T), as the docstring says: shape[-1] is shape[1]"
    ),
    "mask_tokens | selected = (torch.rand(input_ids.shape, generator=generator) < mlm_probability) & ~is_special "
    "# (B, T) | compare | 1": "`<` -> `<=`: " + _DRAW,
    (
        "mask_tokens | inputs = torch.where(selected & (action < 0.8), special.mask, input_ids) # "
        "(B, T) | compare | 1"
    ): "`<` -> `<=`: " + _DRAW,
    "mask_tokens | inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs) # (B, T) "
    "| compare | 1": "`>=` -> `>`: " + _DRAW,
    "mask_tokens | inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs) # (B, T) "
    "| compare | 3": "`<` -> `<=`: " + _DRAW,
    "mask_tokens | inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs) # (B, T) "
    "| compare | 4": "random for action in (0.9, 1) and keep for [0.8, 0.9] instead of the other way round: each "
    "still has probability 0.1, independently of everything else, as the text specifies",
    **{
        f"mask_whole_words | if input_ids.dim() != 2 or word_ids.shape != input_ids.shape: | {k} | 1": (
            "the shape check is a clarity: without it, a mismatched word_ids fails the word-id check "
            "(torch.equal of two shapes is False) and 1-D input_ids fails `B, T = input_ids.shape`, both ValueErrors"
        )
        for k in ("delete", "boolop")
    },
    "mask_whole_words | raise ValueError( | delete | 1": (
        "the first raise (shapes): the later checks raise ValueError for the same inputs, as said above"
    ),
    **{
        f"mask_whole_words | n_words = int(word_ids.max()) + 1 if word_ids.numel() else 1 | number | {k}": (
            "the per-word draw only needs more columns than the largest word id; extra columns are never "
            "gathered, and with no token (numel 0) nothing is selected whatever its width"
        )
        for k in (3, 4, 5, 6)
    },
    "mask_whole_words | chosen = torch.rand((B, max(n_words, 1)), generator=generator) < mlm_probability # "
    "(B, W): per word | number | 3": "max(n_words, 2): one more column that is never gathered, as above",
    "mask_whole_words | chosen = torch.rand((B, max(n_words, 1)), generator=generator) < mlm_probability # "
    "(B, W): per word | compare | 1": "`<` -> `<=`: " + _DRAW,
    "mask_whole_words | selected = chosen.gather(1, word_ids.long().clamp(min=0)) & ~is_special # (B, T) "
    "| number | 2": "gather along dim -1 of a (B, W) tensor is gather along dim 1",
    "mask_whole_words | inputs = torch.where(selected & (action < 0.8), special.mask, input_ids) # (B, T) "
    "| compare | 1": "`<` -> `<=`: " + _DRAW,
    "mask_whole_words | inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs) "
    "# (B, T) | compare | 1": "`>=` -> `>`: " + _DRAW,
    "mask_whole_words | inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs) "
    "# (B, T) | compare | 3": "`<` -> `<=`: " + _DRAW,
    "mask_whole_words | inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs) "
    "# (B, T) | compare | 4": "random for action in (0.9, 1) and keep for [0.8, 0.9] instead of the other way "
    "round: each still has probability 0.1 per token, independently, as the text specifies",
    "mlm_loss | return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100) # (N, V), (N,) "
    "| keyword | 1": "ignore_index=-100 is F.cross_entropy's documented default",
}
