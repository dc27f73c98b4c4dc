"""Wrong implementations for Exercise 9 (the vision transformer), each a mistake students really make.

Each source is the reference definition from :mod:`coursekit.vit` with one edit, so a mutant
differs from the solution exactly where the mistake is (and follows the reference when it changes).
``EQUIVALENT`` holds the automatically generated mutants (``scripts/mutation.py``) that no input the
text allows can tell from the answer.
"""

from coursekit import vit
from tests.mutants import Mutant, mutate

_PERMUTE = "x = x.permute(0, 2, 4, 1, 3, 5)  # (B, rows, cols, C_in, P, P)"
_DIM_CHECK = "    if images.dim() != 4:\n"
_DIVIDES = "    if H_img % P or W_img % P:\n"
_EMBED_CHECK = "if images.dim() != 4 or tuple(images.shape[1:]) != (C_in, size, size):"
_CAT = "return torch.cat([cls, patches], dim=1) + positions  # (B, N_p + 1, C)"
_SHAPE_CHECK = "if tuple(cls_token.shape) != (1, 1, C) or tuple(positions.shape) != (T, C):"
_HEAD = "return self.head(h[:, 0])  # (B, K): the [CLS] token only"
_EMBED = "return self.dropout(add_cls_and_positions(x, self.cls_token, positions))  # (B, N_p + 1, C)"
_POSITIONS = "positions = self.pos_emb(torch.arange(x.shape[1] + 1, device=x.device))  # (N_p + 1, C)"
_BLANK = "blank = (patches != 0).sum(dim=-1) == 0  # (B, N_p): no non-zero value in the patch"
_SINCOS_TABLE = "table = torch.cat([encode(cols), encode(rows)], dim=1)"
_SINCOS_OMEGA = "omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)"
_FORWARD = "h = self.encoder(self.embed(images))  # (B, N_p + 1, C), normalised by the stack's final norm"

MUTANTS = [
    # ----------------------------------------------------------------- part 1: patchify
    Mutant(
        "patchify_channel_last",
        "patchify",
        "patchify",
        "flattened channel-last",
        mutate(vit.patchify, (_PERMUTE, "x = x.permute(0, 2, 4, 3, 5, 1)  # (B, rows, cols, P, P, C_in)")),
    ),
    Mutant(
        "patchify_column_major",
        "patchify",
        "patchify",
        "numbered column by column",
        mutate(vit.patchify, (_PERMUTE, "x = x.permute(0, 4, 2, 1, 3, 5)  # (B, cols, rows, C_in, P, P)")),
    ),
    Mutant(
        "patchify_plain_reshape",
        "patchify",
        "patchify",
        "without cutting it into patches",
        mutate(
            vit.patchify,
            (_PERMUTE, "pass  # forgot to move the patch axes together"),
            ("x = images.reshape(B, C_in, H_img // P, P, W_img // P, P)", "x = images"),
        ),
    ),
    Mutant(
        "patchify_height_width_swapped",
        "patchify",
        "patchify",
        "take them from images.shape[2] and images.shape[3]",
        mutate(
            vit.patchify, ("B, C_in, H_img, W_img = images.shape", "B, C_in, W_img, H_img = images.shape")
        ),
    ),
    Mutant(
        "patchify_checks_height_only",
        "patchify",
        "patchify",
        "8x6 images with P=4",
        mutate(vit.patchify, ("if H_img % P or W_img % P:", "if H_img % P:")),
    ),
    # the promised errors, and the dtype
    Mutant(
        "patchify_accepts_one_unbatched_image",
        "patchify",
        "patchify",
        "images of shape (3, 8, 8)",
        mutate(
            vit.patchify,
            (_DIM_CHECK, "    if images.dim() == 3:\n        images = images[None]\n" + _DIM_CHECK),
        ),
    ),
    Mutant(
        "patchify_zero_patch_size",
        "patchify",
        "patchify",
        "4x4 images with P=0",
        mutate(vit.patchify, ("    if P < 1:\n", "    if P < 0:\n")),
    ),
    Mutant(
        "patchify_crops_instead_of_raising",
        "patchify",
        "patchify",
        "8x8 images with P=3",
        mutate(
            vit.patchify,
            (
                _DIVIDES + '        raise ValueError(f"the image size {H_img}x{W_img} is not '
                "divisible by "
                'patch_size={P}")\n',
                "    H_img, W_img = H_img // P * P, W_img // P * P\n"
                "    images = images[:, :, :H_img, :W_img]\n",
            ),
        ),
    ),
    Mutant(
        "patchify_always_float32",
        "patchify",
        "patchify",
        "expected a float64 tensor",
        mutate(
            vit.patchify,
            (
                "x = images.reshape(B, C_in, H_img // P, P, W_img // P, P)",
                "x = images.float().reshape(B, C_in, H_img // P, P, W_img // P, P)",
            ),
        ),
    ),
    # ----------------------------------------------------------------- part 2: PatchEmbedding
    Mutant(
        "embedding_ignores_channels",
        "PatchEmbedding",
        "PatchEmbedding",
        "proj should map C_in P^2",
        mutate(
            vit.PatchEmbedding,
            (
                "nn.Linear(in_channels * patch_size * patch_size, d_model)",
                "nn.Linear(patch_size * patch_size, d_model)",
            ),
        ),
    ),
    Mutant(
        "embedding_without_bias",
        "PatchEmbedding",
        "PatchEmbedding",
        "proj needs a bias",
        mutate(
            vit.PatchEmbedding,
            (
                "nn.Linear(in_channels * patch_size * patch_size, d_model)",
                "nn.Linear(in_channels * patch_size * patch_size, d_model, bias=False)",
            ),
        ),
    ),
    Mutant(
        "embedding_reshapes_instead_of_patchify",
        "PatchEmbedding",
        "PatchEmbedding",
        "without cutting it into patches",
        mutate(
            vit.PatchEmbedding,
            (
                "self.proj(patchify(images, self.patch_size))",
                "self.proj(images.reshape(images.shape[0], -1, self.proj.in_features))",
            ),
        ),
    ),
    Mutant(
        "embedding_no_shape_check",
        "PatchEmbedding",
        "PatchEmbedding",
        "given 1-channel images",
        mutate(vit.PatchEmbedding, (_EMBED_CHECK, "if False:")),
    ),
    # every clause of the promised errors
    Mutant(
        "embedding_checks_channels_only",
        "PatchEmbedding",
        "PatchEmbedding",
        "given 16x16 images",
        mutate(vit.PatchEmbedding, (_EMBED_CHECK, "if images.dim() != 4 or images.shape[1] != C_in:")),
    ),
    Mutant(
        "embedding_checks_height_only",
        "PatchEmbedding",
        "PatchEmbedding",
        "the height fits, the width does not",
        mutate(
            vit.PatchEmbedding,
            (_EMBED_CHECK, "if images.dim() != 4 or tuple(images.shape[1:3]) != (C_in, size):"),
        ),
    ),
    Mutant(
        "embedding_accepts_one_unbatched_image",
        "PatchEmbedding",
        "PatchEmbedding",
        "without a batch axis",
        mutate(
            vit.PatchEmbedding,
            (
                "        C_in, size = self.in_channels, self.image_size\n",
                "        C_in, size = self.in_channels, self.image_size\n"
                "        if images.dim() == 3:\n            return self(images[None])[0]\n",
            ),
        ),
    ),
    Mutant(
        "embedding_constructor_accepts_any_patch_size",
        "PatchEmbedding",
        "PatchEmbedding",
        "PatchEmbedding(8, 3, 3, 12)",
        mutate(
            vit.PatchEmbedding,
            (
                "        if image_size % patch_size:\n            raise "
                'ValueError(f"patch_size='
                '{patch_size} must divide image_size={image_size}")\n',
                "",
            ),
        ),
    ),
    # ----------------------------------------------------------------- part 3: add_cls_and_positions
    Mutant(
        "cls_appended_at_the_end",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "[CLS] was put at the end",
        mutate(vit.add_cls_and_positions, (_CAT, "return torch.cat([patches, cls], dim=1) + positions")),
    ),
    Mutant(
        "cls_without_position",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "[CLS] got no position",
        mutate(vit.add_cls_and_positions, (_CAT, "return torch.cat([cls, patches + positions[1:]], dim=1)")),
    ),
    Mutant(
        "cls_not_expanded",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "expand it to (B, 1, C)",
        mutate(
            vit.add_cls_and_positions, (_CAT, "return torch.cat([cls_token, patches], dim=1) + positions")
        ),
    ),
    Mutant(
        "positions_detached",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "the gradient of positions",
        mutate(
            vit.add_cls_and_positions, (_CAT, "return torch.cat([cls, patches], dim=1) + positions.detach()")
        ),
    ),
    Mutant(
        "cls_patches_detached",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "the gradient of the patches",
        mutate(
            vit.add_cls_and_positions, (_CAT, "return torch.cat([cls, patches.detach()], dim=1) + positions")
        ),
    ),
    Mutant(
        "cls_positions_added_in_place",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "patches was changed in place",
        mutate(
            vit.add_cls_and_positions,
            (_CAT, "patches += positions[1:]\n    return torch.cat([cls + positions[:1], patches], dim=1)"),
        ),
    ),
    Mutant(
        "cls_no_shape_check",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "positions (4, 3) for 4 patches",
        mutate(vit.add_cls_and_positions, (_SHAPE_CHECK, "if False:")),
    ),
    Mutant(
        "cls_checks_positions_only",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "cls_token (1, 1, 6)",
        mutate(vit.add_cls_and_positions, (_SHAPE_CHECK, "if tuple(positions.shape) != (T, C):")),
    ),
    Mutant(
        "cls_in_float32",
        "add_cls_and_positions",
        "add_cls_and_positions",
        "float64 tensor",
        mutate(
            vit.add_cls_and_positions, (_CAT, "return (torch.cat([cls, patches], dim=1) + positions).float()")
        ),
    ),
    # ----------------------------------------------------------------- part 4: ViT
    Mutant(
        "vit_reads_the_mean",
        "ViT",
        "ViT",
        "reads the mean of all tokens",
        mutate(vit.ViT, (_HEAD, "return self.head(h.mean(dim=1))")),
    ),
    Mutant(
        "vit_reads_the_last_token",
        "ViT",
        "ViT",
        "reads the last token",
        mutate(vit.ViT, (_HEAD, "return self.head(h[:, -1])")),
    ),
    Mutant(
        "vit_returns_probabilities",
        "ViT",
        "ViT",
        "forward returns probabilities",
        mutate(vit.ViT, (_HEAD, "return torch.softmax(self.head(h[:, 0]), dim=-1)")),
    ),
    Mutant(
        "vit_skips_the_final_norm",
        "ViT",
        "ViT",
        "the final layer norm is missing",
        mutate(
            vit.ViT,
            (
                "h = self.encoder(self.embed(images))",
                "h = self.embed(images)\n        for layer in self.encoder.layers:\n            h = layer(h)",
            ),
        ),
    ),
    Mutant(
        "vit_no_positions",
        "ViT",
        "ViT",
        "embed does not add the positions",
        mutate(
            vit.ViT,
            (_EMBED, "return self.dropout(torch.cat([self.cls_token.expand(x.shape[0], 1, -1), x], dim=1))"),
        ),
    ),
    # the dropout: missing, in the wrong place, twice, or active in eval mode
    Mutant(
        "vit_dropout_missing",
        "ViT",
        "ViT",
        "embed returned the tokens unchanged",
        mutate(vit.ViT, (_EMBED, "return add_cls_and_positions(x, self.cls_token, positions)")),
    ),
    Mutant(
        "vit_dropout_on_the_patches_only",
        "ViT",
        "ViT",
        "only the patch embeddings were zeroed",
        mutate(vit.ViT, (_EMBED, "return add_cls_and_positions(self.dropout(x), self.cls_token, positions)")),
    ),
    Mutant(
        "vit_dropout_after_the_encoder",
        "ViT",
        "ViT",
        "not in forward",
        mutate(
            vit.ViT,
            (_EMBED, "return add_cls_and_positions(x, self.cls_token, positions)"),
            (_FORWARD, "h = self.dropout(self.encoder(self.embed(images)))"),
        ),
    ),
    Mutant(
        "vit_dropout_twice",
        "ViT",
        "ViT",
        "0 or twice the value without dropout",
        mutate(
            vit.ViT,
            (
                _EMBED,
                "return self.dropout(add_cls_and_positions(self.dropout(x), self.cls_token, positions))",
            ),
        ),
    ),
    Mutant(
        "vit_dropout_in_eval_mode",
        "ViT",
        "ViT",
        "in eval mode with dropout=0.5",
        mutate(
            vit.ViT,
            (_EMBED, "return F.dropout(add_cls_and_positions(x, self.cls_token, positions), self.dropout.p)"),
        ),
    ),
    Mutant(
        "vit_forward_builds_its_own_tokens",
        "ViT",
        "ViT",
        "forward must run the encoder on self.embed(images)",
        mutate(
            vit.ViT,
            (
                _FORWARD,
                "x = self.patch_embed(images)\n        positions = "
                "self.pos_emb(torch.arange(x.shape[1] + "
                "1, device=x.device))\n        h = self.encoder(add_cls_and_positions(x, "
                "self.cls_token, "
                "positions))",
            ),
        ),
    ),
    # the device of the positions
    Mutant(
        "vit_positions_on_the_default_device",
        "ViT",
        "ViT",
        "make the positions on the images' device",
        mutate(vit.ViT, (_POSITIONS, "positions = self.pos_emb(torch.arange(x.shape[1] + 1))")),
    ),
    # ----------------------------------------------------------------- part 5: predictions
    Mutant(
        "tokens_forget_cls",
        "predict_digit_tokens",
        "predict_digit_tokens",
        "the experiment gives 50",
        "predict_digit_tokens = 49\n",
    ),
    Mutant(
        "tokens_one_row_of_patches",
        "predict_digit_tokens",
        "predict_digit_tokens",
        "you predicted 8",
        "predict_digit_tokens = 8\n",
    ),
    Mutant(
        "tokens_count_pixels",
        "predict_digit_tokens",
        "predict_digit_tokens",
        "you predicted 785",
        "predict_digit_tokens = 785\n",
    ),
    Mutant(
        "tokens_as_text",
        "predict_digit_tokens",
        "predict_digit_tokens",
        "should be a finite number",
        'predict_digit_tokens = "50"\n',
    ),
    Mutant(
        "pairs_linear_in_tokens",
        "predict_attention_pairs",
        "predict_attention_pairs",
        "the experiment gives (d)",
        'predict_attention_pairs = "c"\n',
    ),
    Mutant(
        "pairs_linear_in_side",
        "predict_attention_pairs",
        "predict_attention_pairs",
        "you predicted (b)",
        'predict_attention_pairs = "b"\n',
    ),
    Mutant(
        "pairs_same_weights",
        "predict_attention_pairs",
        "predict_attention_pairs",
        "you predicted (a)",
        'predict_attention_pairs = "a"\n',
    ),
    Mutant(
        "pairs_not_a_letter",
        "predict_attention_pairs",
        "predict_attention_pairs",
        "one of the letters",
        "predict_attention_pairs = 9\n",
    ),
    Mutant(
        "scrambled_thinks_nothing_lost_means_no_change",
        "predict_scrambled_pixels",
        "predict_scrambled_pixels",
        "you predicted (a) both stay",
        'predict_scrambled_pixels = "a"\n',
    ),
    Mutant(
        "scrambled_thinks_patches_need_strokes",
        "predict_scrambled_pixels",
        "predict_scrambled_pixels",
        "you predicted (b) the ViT loses",
        'predict_scrambled_pixels = "b"\n',
    ),
    Mutant(
        "scrambled_thinks_both_fail",
        "predict_scrambled_pixels",
        "predict_scrambled_pixels",
        "the experiment gives (c) the CNN loses",
        'predict_scrambled_pixels = "d"\n',
    ),
    Mutant(
        "scrambled_not_a_letter",
        "predict_scrambled_pixels",
        "predict_scrambled_pixels",
        "one of the letters",
        "predict_scrambled_pixels = 3\n",
    ),
    # ----------------------------------------------------------------- part 6: the experiment
    Mutant(
        "blank_share_of_non_blank",
        "blank_patch_share",
        "blank_patch_share",
        "not of non-blank ones",
        mutate(vit.blank_patch_share, (_BLANK, "blank = (patches != 0).sum(dim=-1) != 0  # (B, N_p)")),
    ),
    Mutant(
        "blank_share_of_pixels",
        "blank_patch_share",
        "blank_patch_share",
        "not of pixels",
        mutate(vit.blank_patch_share, (_BLANK, "blank = patches == 0  # (B, N_p, C_in P^2)")),
    ),
    Mutant(
        "blank_share_by_sum",
        "blank_patch_share",
        "blank_patch_share",
        "whose values are all exactly 0",
        mutate(vit.blank_patch_share, (_BLANK, "blank = patches.sum(dim=-1) == 0  # (B, N_p)")),
    ),
    Mutant(
        "blank_share_near_zero",
        "blank_patch_share",
        "blank_patch_share",
        "whose values are all exactly 0",
        mutate(vit.blank_patch_share, (_BLANK, "blank = patches.abs().amax(dim=-1) < 1e-3  # (B, N_p)")),
    ),
    Mutant(
        "blank_share_no_empty_check",
        "blank_patch_share",
        "blank_patch_share",
        "an empty batch",
        mutate(vit.blank_patch_share, ("    if patches.shape[0] == 0:\n", "    if False:\n")),
    ),
    Mutant(
        "blank_share_tensor",
        "blank_patch_share",
        "blank_patch_share",
        "Python float",
        mutate(
            vit.blank_patch_share, ("return blank.double().mean().item()", "return blank.double().mean()")
        ),
    ),
    # a procedure whose share lands in the band, and the errors of patchify
    Mutant(
        "blank_share_mean_of_chunks",
        "blank_patch_share",
        "blank_patch_share",
        "a mean of the shares of chunks",
        mutate(
            vit.blank_patch_share,
            (
                "return blank.double().mean().item()",
                "shares = [chunk.double().mean() for chunk in blank.split(128)]  # chunks of 128 images\n"
                "    return float(sum(shares) / len(shares))",
            ),
        ),
    ),
    Mutant(
        "blank_share_divides_before_patchify",
        "blank_patch_share",
        "blank_patch_share",
        "P=0 for 8x8 images",
        mutate(
            vit.blank_patch_share,
            (
                "    patches = patchify(images, patch_size)",
                "    if images.dim() == 4 and (images.shape[2] % patch_size or images.shape[3] % patch_size):\n"
                '        raise ValueError(f"patch_size={patch_size} does not divide {tuple(images.shape[2:])}")\n'
                "    patches = patchify(images, patch_size)",
            ),
        ),
    ),
    # ----------------------------------------------------------------- stretch: sincos_2d_positions
    Mutant(
        "sincos_halves_swapped",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "the halves are swapped",
        mutate(
            vit.sincos_2d_positions, (_SINCOS_TABLE, "table = torch.cat([encode(rows), encode(cols)], dim=1)")
        ),
    ),
    Mutant(
        "sincos_cos_before_sin",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "the dim/4 sines first",
        mutate(
            vit.sincos_2d_positions,
            (
                "return torch.cat([angles.sin(), angles.cos()], dim=1)",
                "return torch.cat([angles.cos(), angles.sin()], dim=1)",
            ),
        ),
    ),
    Mutant(
        "sincos_interleaved",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "split, not interleaved",
        mutate(
            vit.sincos_2d_positions,
            (
                "return torch.cat([angles.sin(), angles.cos()], dim=1)",
                "return torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(len(angles), -1)",
            ),
        ),
    ),
    Mutant(
        "sincos_exponent_over_dim",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "w_i = 1/10000^(2i/(dim/2))",
        mutate(
            vit.sincos_2d_positions,
            (
                _SINCOS_OMEGA,
                "omega = 1.0 / 10000.0 ** (2 * torch.arange(quarter, dtype=torch.float64) / dim)",
            ),
        ),
    ),
    Mutant(
        "sincos_no_cls_row",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "should be a float32 tensor",
        mutate(vit.sincos_2d_positions, ("    if cls_token:\n", "    if False:\n")),
    ),
    Mutant(
        "sincos_cls_row_last",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "comes first, before the patches",
        mutate(
            vit.sincos_2d_positions,
            (
                "table = torch.cat([table.new_zeros(1, dim), table], dim=0)",
                "table = torch.cat([table, table.new_zeros(1, dim)], dim=0)",
            ),
        ),
    ),
    Mutant(
        "sincos_column_major",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "numbered row by row",
        mutate(vit.sincos_2d_positions, ('indexing="ij"', 'indexing="xy"')),
    ),
    Mutant(
        "sincos_float64",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "should be a float32 tensor",
        mutate(vit.sincos_2d_positions, ("return table.float()", "return table")),
    ),
    Mutant(
        "sincos_no_dim_check",
        "sincos_2d_positions",
        "sincos_2d_positions",
        "raise a ValueError",
        mutate(vit.sincos_2d_positions, ("if dim < 4 or dim % 4:", "if dim < 4:")),
    ),
]

_UNPACK = "unpacking the shape of a tensor of another rank into its names raises ValueError anyway"

EQUIVALENT = {
    "patchify | if images.dim() != 4: | delete | 1": "B, C_in, H_img, W_img = images.shape: " + _UNPACK,
    'patchify | raise ValueError(f"expected images of shape (B, C_in, H_img, W_img), got {tuple(images.shape)}") | '
    "delete | 1": "B, C_in, H_img, W_img = images.shape: " + _UNPACK,
    "patchify | x = x.permute(0, 2, 4, 1, 3, 5) # (B, rows, cols, C_in, P, P) | number | 22": (
        "-1 names the last of the six axes, which is axis 5"
    ),
    "add_cls_and_positions | if patches.dim() != 3: | delete | 1": "B, N_p, C = patches.shape: " + _UNPACK,
    'add_cls_and_positions | raise ValueError(f"expected patches of shape (B, N_p, C), got {tuple(patches.shape)}") | '
    "delete | 1": "B, N_p, C = patches.shape: " + _UNPACK,
    (
        "add_cls_and_positions | cls = cls_token.expand(B, 1, C) # (B, 1, C): the same vector for "
        "every image | number | 2"
    ): ("cls_token is (1, 1, C) once the shapes are checked, and expand's -1 keeps that axis's size, 1"),
    "sincos_2d_positions | if dim < 4 or dim % 4: | number | 2": (
        "dim < 1 or dim % 4 rejects the same dims: 1, 2 and 3 are not multiples of 4"
    ),
    "sincos_2d_positions | if dim < 4 or dim % 4: | number | 5": (
        "dim < 3 or dim % 4 rejects the same dims: 3 is not a multiple of 4"
    ),
    "sincos_2d_positions | quarter = dim // 4 | binop | 1": (
        "dim is a multiple of 4 once checked, so dim / 4 is the same whole number (arange and the float64 "
        "division give the same values)"
    ),
    "sincos_2d_positions | rows, cols = torch.meshgrid( | keyword | 1": (
        'torch.meshgrid\'s default indexing is "ij" (it only warns that the default may change)'
    ),
    "sincos_2d_positions | return torch.cat([angles.sin(), angles.cos()], dim=1) | number | 2": (
        "angles is 2-D, so dim=-1 is dim=1"
    ),
    (
        "sincos_2d_positions | table = torch.cat([encode(cols), encode(rows)], dim=1) # (grid_h grid_w, dim): "
        "column half, then row half | number | 2"
    ): "both halves are 2-D, so dim=-1 is dim=1",
    "sincos_2d_positions | table = torch.cat([table.new_zeros(1, dim), table], dim=0) # (1 + grid_h grid_w, dim) "
    "| keyword | 1": "torch.cat's default dim is 0",
}
