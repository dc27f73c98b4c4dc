"""Wrong implementations for Exercise 9 (the vision transformer), each a mistake students really make.

Each source is the reference definition from :mod:`coursekit.vit` with one edit, so a mutant
differs from the solution exactly where the mistake is (and follows the reference when it changes).
"""

from coursekit import vit
from tests.mutants import Mutant, mutate



_PERMUTE = "x = x.permute(0, 2, 4, 1, 3, 5)  # (B, rows, cols, C_in, P, P)"
_CAT = "return torch.cat([cls, patches], dim=1) + positions  # (B, N_p + 1, C)"
_HEAD = "return self.head(h[:, 0])  # (B, K): the [CLS] token only"
_EMBED = "return self.dropout(add_cls_and_positions(x, self.cls_token, positions))  # (B, N_p + 1, C)"

MUTANTS = [
    # ----------------------------------------------------------------- part 1: patchify
    Mutant("patchify_channel_last", "patchify", "patchify", "flattened channel-last",
           mutate(vit.patchify, (_PERMUTE, "x = x.permute(0, 2, 4, 3, 5, 1)  # (B, rows, cols, P, P, C_in)"))),
    Mutant("patchify_column_major", "patchify", "patchify", "numbered column by column",
           mutate(vit.patchify, (_PERMUTE, "x = x.permute(0, 4, 2, 1, 3, 5)  # (B, cols, rows, C_in, P, P)"))),
    Mutant("patchify_plain_reshape", "patchify", "patchify", "without cutting it into patches",
           mutate(vit.patchify, (_PERMUTE, "pass  # forgot to move the patch axes together"),
                    ("x = images.reshape(B, C_in, H_img // P, P, W_img // P, P)", "x = images"))),
    Mutant("patchify_height_width_swapped", "patchify", "patchify", "take them from images.shape[2] and images.shape[3]",
           mutate(vit.patchify, ("B, C_in, H_img, W_img = images.shape", "B, C_in, W_img, H_img = images.shape"))),
    Mutant("patchify_checks_height_only", "patchify", "patchify", "8x6 images with P=4",
           mutate(vit.patchify, ("if H_img % P or W_img % P:", "if H_img % P:"))),
    # ----------------------------------------------------------------- part 2: PatchEmbedding
    Mutant("embedding_ignores_channels", "PatchEmbedding", "PatchEmbedding", "proj should map C_in P^2",
           mutate(vit.PatchEmbedding, ("nn.Linear(in_channels * patch_size * patch_size, d_model)",
                                         "nn.Linear(patch_size * patch_size, d_model)"))),
    Mutant("embedding_without_bias", "PatchEmbedding", "PatchEmbedding", "proj needs a bias",
           mutate(vit.PatchEmbedding, ("nn.Linear(in_channels * patch_size * patch_size, d_model)",
                                         "nn.Linear(in_channels * patch_size * patch_size, d_model, bias=False)"))),
    Mutant("embedding_reshapes_instead_of_patchify", "PatchEmbedding", "PatchEmbedding", "without cutting it into patches",
           mutate(vit.PatchEmbedding, ("self.proj(patchify(images, self.patch_size))",
                                         "self.proj(images.reshape(images.shape[0], -1, self.proj.in_features))"))),
    Mutant("embedding_no_shape_check", "PatchEmbedding", "PatchEmbedding", "given 1-channel images",
           mutate(vit.PatchEmbedding, ("if images.dim() != 4 or tuple(images.shape[1:]) != expected:", "if False:"))),
    # ----------------------------------------------------------------- part 3: add_cls_and_positions
    Mutant("cls_appended_at_the_end", "add_cls_and_positions", "add_cls_and_positions", "[CLS] was put at the end",
           mutate(vit.add_cls_and_positions, (_CAT, "return torch.cat([patches, cls], dim=1) + positions"))),
    Mutant("cls_without_position", "add_cls_and_positions", "add_cls_and_positions", "[CLS] got no position",
           mutate(vit.add_cls_and_positions, (_CAT, "return torch.cat([cls, patches + positions[1:]], dim=1)"))),
    Mutant("cls_not_expanded", "add_cls_and_positions", "add_cls_and_positions", "expand it to (B, 1, C)",
           mutate(vit.add_cls_and_positions, (_CAT, "return torch.cat([cls_token, patches], dim=1) + positions"))),
    Mutant("positions_detached", "add_cls_and_positions", "add_cls_and_positions", "the gradient of positions",
           mutate(vit.add_cls_and_positions, (_CAT, "return torch.cat([cls, patches], dim=1) + positions.detach()"))),
    # ----------------------------------------------------------------- part 4: ViT
    Mutant("vit_reads_the_mean", "ViT", "ViT", "reads the mean of all tokens",
           mutate(vit.ViT, (_HEAD, "return self.head(h.mean(dim=1))"))),
    Mutant("vit_reads_the_last_token", "ViT", "ViT", "reads the last token",
           mutate(vit.ViT, (_HEAD, "return self.head(h[:, -1])"))),
    Mutant("vit_returns_probabilities", "ViT", "ViT", "forward returns probabilities",
           mutate(vit.ViT, (_HEAD, "return torch.softmax(self.head(h[:, 0]), dim=-1)"))),
    Mutant("vit_skips_the_final_norm", "ViT", "ViT", "the final layer norm is missing",
           mutate(vit.ViT, ("h = self.encoder(self.embed(images))", "h = self.embed(images)\n"
                              "        for layer in self.encoder.layers:\n"
                              "            h = layer(h)"))),
    Mutant("vit_no_positions", "ViT", "ViT", "embed does not add the positions",
           mutate(vit.ViT, (_EMBED, "return self.dropout(torch.cat([self.cls_token.expand(x.shape[0], 1, -1), x], dim=1))"))),
]
