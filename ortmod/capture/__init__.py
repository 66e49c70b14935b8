"""ortmod's capture package (issue 36): the model's forward to ONNX, on two paths.

Leaves first; an arrow is "imports", and nothing imports upward (tests/test_import_graph.py):

    errors          the capture errors, TraceHazardWarning, where a failure points    (no ortmod import)
    compat          the one module that touches torch's private internals
    onnx_util       the opset, g.op helpers, torch's own rule for an op            -> compat, errors
    flatten         a call as flat lists, its schema key, the Exported record        -> compat, errors
    tracing         stop-gradient mode, trace guards (both paths)                    -> compat, errors, python_op
    rules/          ortmod's rules per family: <family>.py TorchScript symbolics, <family>_onnxscript.py
                    torch.export translations                                       -> the leaves
    torchscript_registry, export_registry   each path's registry of rules           -> rules
    torchscript, export (+ fx_passes, function_apply, shape_guard, export_semantics, audit)
                    the two drivers                                                  -> registries, leaves

This file imports nothing, so ``import ortmod.capture.compat`` costs no more than compat itself.
"""
