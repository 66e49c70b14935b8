"""Module hooks a sharding library installs, taken off while an export traces the module.

FSDP2 and DeepSpeed ZeRO-3 gather parameters in forward (pre-)hooks on every submodule. While
ortmod's export traces the forward, ortmod has gathered them itself and the library's hooks must
not run (they would gather again, or reshard under the trace); they are restored afterwards.
"""
import contextlib


def hook_library(hook):
    """The module name of the function behind a hook, through bound methods and functools.wraps."""
    f = getattr(hook, "__func__", hook)
    while hasattr(f, "__wrapped__"):
        f = f.__wrapped__
    f = getattr(f, "__func__", f)
    return getattr(f, "__module__", None) or ""


@contextlib.contextmanager
def hooks_removed(module, attrs, library):
    """Every hook in `attrs` (e.g. "_forward_pre_hooks") of `module` and its submodules whose
    function comes from the package `library` (a module-name prefix) is off inside the block."""
    saved = []
    for m in module.modules():
        for attr in attrs:
            hooks = getattr(m, attr)
            theirs = [k for k, h in hooks.items() if hook_library(h).startswith(library)]
            if theirs:
                saved.append((hooks, dict(hooks)))
                for k in theirs:
                    del hooks[k]
    try:
        yield
    finally:
        for hooks, before in saved:
            hooks.clear()
            hooks.update(before)
