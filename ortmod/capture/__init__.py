"""ortmod's capture package (issue 36's shape): the model's forward to ONNX.

Its first module is ``compat``, the one place that touches torch's internals. This file imports
nothing, so ``import ortmod.capture.compat`` costs no more than compat itself.
"""
