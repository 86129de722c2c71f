"""Figures and widgets for the lessons. Only this package imports matplotlib and ipywidgets,
and only inside functions, so the kernels and the reference never depend on them.

Each lesson's figure is two steps: ``run_*`` runs the real kernel on the active backend for
given parameters and collects what to draw in a small dataclass, and ``draw_*_run`` paints
that dataclass with the shared primitives of ``viz.draw`` and ``viz.style``. The plain
``draw_*`` function does both and returns a matplotlib Figure (used by the widget, the tests
and any static export), and a ``*_widget`` function re-runs it on every change
(``viz.live``).
"""
