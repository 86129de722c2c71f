"""The file that marks a folder as the course's root.

The course is known by this file at its root, not by its folder names: a research folder with
a notebooks/ of its own must never have its outputs stripped. The command line and the
learner's workspace both read it; it lives here, below both, so neither imports the other.
"""

COURSE_MARKER = ".slotmap-course"
