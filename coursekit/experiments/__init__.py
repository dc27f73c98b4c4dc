"""What the book trains and measures: data, recipes, training runs, baselines and measurements.

The chapter modules (:mod:`coursekit.bert`, :mod:`coursekit.gpt`, :mod:`coursekit.seq2seq`,
:mod:`coursekit.vit`, :mod:`coursekit.long_context`, ...) hold the models and techniques and
import only earlier chapters, as nanoGPT's ``model.py`` imports nothing from ``train.py``; the
experiments built on them live here, where they may also use the shared training loop
(:mod:`coursekit.train`) and data (:mod:`coursekit.data`):

- :mod:`coursekit.experiments.recurrence` (Chapter 1): recalling a token k steps back, a GRU
  against one attention layer, and its committed three-seed results;
- :mod:`coursekit.experiments.positional` (Chapter 3): the train-short, test-long experiment for
  four kinds of positions, and its committed five-seed results;
- :mod:`coursekit.experiments.norm_ffn` (Chapter 4): LayerNorm and GELU against Llama's RMSNorm
  and SwiGLU on the copy task, and its committed three-seed results;
- :mod:`coursekit.experiments.bert_mlm` and :mod:`coursekit.experiments.topics` (Chapter 6):
  masked-language-model batches and evaluation, the ``bert-small`` recipe, the topic
  classification task and its fine-tuning and baseline;
- :mod:`coursekit.experiments.bert_pairs` (Chapter 6): next-sentence and sentence-order prediction,
  what word overlap alone gets on each, and bert-small fine-tuned on both with and without its
  segment embeddings (committed three-seed results);
- :mod:`coursekit.experiments.nsp_negatives` (Chapter 6): the word-overlap classifier on next-sentence
  pairs whose negatives come from another topic or from the same one, the exercise's question on
  what NSP gives away (committed three-seed results);
- :mod:`coursekit.experiments.bert_labels` (Chapter 6): the topic task with 16 to all labelled
  passages, pretrained against randomly initialised (committed three-seed results);
- :mod:`coursekit.experiments.gpt_char` (Chapter 7): the ``gpt-char`` recipe;
- :mod:`coursekit.experiments.number_words` (Chapter 8): the English-to-German number task,
  its training, chrF and the ``seq2seq-numbers`` recipe;
- :mod:`coursekit.experiments.number_words_ood` (Chapter 8): the held-out split, its error
  analysis and BLEU next to chrF (committed three-seed results);
- :mod:`coursekit.experiments.digits` (Chapter 9): scikit-learn's 8x8 digits, the ViT's and the
  CNN's training recipes, the small CNN and the scikit-learn baselines;
- :mod:`coursekit.experiments.data_scale` (Chapter 9): the CNN against the ViT on 50 to all
  training images (committed three-seed results);
- :mod:`coursekit.experiments.scrambled_pixels` (Chapter 9): the CNN and the ViT on digits whose pixels
  are scrambled inside every 4x4 patch, the exercise's question on inductive bias (committed
  three-seed results);
- :mod:`coursekit.experiments.roofline` (the arithmetic appendix): this machine's measured
  matmul peak and memory bandwidth, and the FLOP/s a decoding step reaches;
- :mod:`coursekit.experiments.long_context` (Chapter 10): the memory probe of one attention call
  and the train-short, test-long needle experiment with its small language model.

Committed results are read back with :func:`coursekit.experiments._results.read_results`, which refuses
a file that the code's current settings would not write.

The committed checkpoints' recipes are registered in :mod:`coursekit.checkpoints`.
"""
