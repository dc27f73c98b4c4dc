"""Diagrams the book draws with Matplotlib: one module per chapter, each function returning its Figure.

They draw structure (data flow, shapes, the order of operations) from the same code and
configurations the chapters use, in the book's style (:func:`coursekit.viz.use_book_style`), so
a diagram cannot show a shape the code does not produce.
"""
