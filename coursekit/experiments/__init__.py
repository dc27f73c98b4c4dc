"""What the book trains and measures: data, recipes, training runs, baselines and measurements.

The chapter modules (``coursekit.gpt``, ``coursekit.vit``, ``coursekit.long_context``, ...) hold
the models and techniques and import only earlier chapters; the experiments built on them live
here, where they may also use the shared training loop (:mod:`coursekit.train`) and data
(:mod:`coursekit.data`):

- :mod:`coursekit.experiments.digits` (Chapter 9): scikit-learn's 8x8 digits, the ViT's and the
  CNN's training recipes, the small CNN and the scikit-learn baselines;
- :mod:`coursekit.experiments.long_context` (Chapter 10): the memory probe of one attention call
  and the train-short, test-long needle experiment with its small language model.
"""
