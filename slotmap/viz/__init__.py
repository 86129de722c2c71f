"""Figures and widgets for the lessons. Only this package imports matplotlib and ipywidgets,
and only inside functions, so the kernels and the reference never depend on them.

Each lesson's figure has a plain ``draw_*`` function that runs the real kernel on the active
backend for given parameters and returns a matplotlib Figure (used by the widget, the tests
and any static export), and a ``*_widget`` function that re-runs it on every change.
"""
