"""What the book trains and measures: data, training recipes, evaluations and baselines.

The model files (:mod:`coursekit.bert`, :mod:`coursekit.gpt`, :mod:`coursekit.seq2seq`, ...)
hold the models only, as nanoGPT's ``model.py`` does; each module here is one chapter's
experiment around its model and may import :mod:`coursekit.train` and :mod:`coursekit.data`.
The recipes of the committed checkpoints live here and are registered in
:mod:`coursekit.checkpoints`.
"""
