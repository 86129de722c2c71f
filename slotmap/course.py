"""The course's entry point: ``import slotmap.course`` first, in every notebook.

Importing the library has no side effects; the course needs two. It chooses the backend before
the learner's own ``@triton.jit`` kernels are decorated (on a CPU, Triton's interpreter, which
``TRITON_INTERPRET=1`` selects), and it names the backend in one line.
"""

from slotmap import backend

backend.announce()
