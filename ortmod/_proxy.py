"""The nn.Module API of ORTModule that shows the wrapped model through (the ``ModuleAPI`` part
of ORTModule, ortmod/_module.py): its parameters, buffers, submodules, state_dict, train/eval,
conversions and attributes are the wrapped model's, and ``ORTModule(model).forward`` looks like
the wrapped forward to what introspects it while a call runs the engine.

Trainers and launchers decide what to do with a model by looking at it: the HF Trainer keeps the
dataset columns that inspect.signature(model.forward) names and saves with save_pretrained when
isinstance(model, PreTrainedModel); Accelerate and DeepSpeed read attributes of the user's model
(config, _keys_to_ignore_on_save, ...). ORTModule answers as the wrapped model does, the way a
transparent proxy does (wrapt's ObjectProxy): its forward's signature is the wrapped forward's,
``__class__`` is the wrapped model's class (ortmod/_module.py), attributes it does not have are the
wrapped model's (ModuleAPI.__getattr__). What it computes stays its own.
"""
import inspect


def ortmodule_forward(self, *args, **kwargs):
    """ORTModule's forward as a plain function (what ``ORTModule.forward`` and a bound forward's
    ``__func__`` are: a wrapper that rebinds it, as Accelerate's mixed-precision output cast does,
    still runs the engine)."""
    return self._ortmod_forward(args, kwargs)


class BoundForward:
    # ``ORTModule(model).forward``: a call runs the engine, as the method did; what introspects a
    # callable (inspect.signature, ``__wrapped__``, ``__name__``, ``__doc__``) sees the wrapped
    # model's forward. The HF Trainer drops every dataset column that the signature does not name:
    # with ``(*args, **kwargs)`` it dropped them all. (No docstring: ``__doc__`` is the wrapped one.)

    __slots__ = ("__self__",)

    def __init__(self, owner):
        self.__self__ = owner

    def __call__(self, *args, **kwargs):
        return self.__self__._ortmod_forward(args, kwargs)

    @property
    def __func__(self):
        return ortmodule_forward

    @property
    def __wrapped__(self):
        return self.__self__._modules["_original_module"].forward

    @property
    def __signature__(self):
        return inspect.signature(self.__wrapped__)

    @property
    def __name__(self):
        return getattr(self.__wrapped__, "__name__", "forward")

    @property
    def __doc__(self):
        return getattr(self.__wrapped__, "__doc__", None)

    def __eq__(self, other):
        return isinstance(other, BoundForward) and other.__self__ is self.__self__

    def __hash__(self):
        return hash((BoundForward, id(self.__self__)))

    def __repr__(self):
        return f"<ORTModule forward of {self.__wrapped__!r}>"


class ForwardDescriptor:
    """``ORTModule.forward``: on the class the plain function, on an instance a BoundForward."""

    def __get__(self, obj, cls=None):
        return ortmodule_forward if obj is None else BoundForward(obj)


class ModuleAPI:
    """The nn.Module methods that ORTModule answers with the wrapped model's (mixed into
    ORTModule before torch.nn.Module)."""

    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        self._original_module.train(mode)
        return self

    def _apply(self, fn, recurse=True):
        # .to(dtype), .double(), .cpu(), ...: convert the wrapped module's tensors
        self._original_module._apply(fn, recurse)
        self.__dict__["_ortmod_state"] = None      # dtypes/devices may have changed
        return self

    def apply(self, fn):
        self._original_module.apply(fn)
        return self

    def modules(self):
        return self._original_module.modules()

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        return self._original_module.named_modules(memo=memo, prefix=prefix,
                                                   remove_duplicate=remove_duplicate)

    def children(self):
        return self._original_module.children()

    def named_children(self):
        return self._original_module.named_children()

    def _replicate_for_data_parallel(self):
        raise TypeError("ortmod: nn.DataParallel around ORTModule is not supported; use "
                        "torch.nn.parallel.DistributedDataParallel(ORTModule(model)) instead.")

    def state_dict(self, *args, **kwargs):
        return self._original_module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return self._original_module.load_state_dict(state_dict, strict=strict, assign=assign)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._original_module.named_parameters(prefix=prefix, recurse=recurse,
                                                      remove_duplicate=remove_duplicate)

    def parameters(self, recurse=True):
        return self._original_module.parameters(recurse=recurse)

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._original_module.named_buffers(prefix=prefix, recurse=recurse,
                                                   remove_duplicate=remove_duplicate)

    def buffers(self, recurse=True):
        return self._original_module.buffers(recurse=recurse)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules", {})
            if "_original_module" in modules:
                return getattr(modules["_original_module"], name)
            raise

    def _ortmod_owns(self, name):
        d = self.__dict__
        return (not d.get("_ortmod_ready") or name in d or name.startswith("_ortmod")
                or hasattr(type(self), name) or name in d.get("_modules", ())
                or name.startswith("ds_") or name in HOOK_BOOKKEEPING)

    def __setattr__(self, name, value):
        if self._ortmod_owns(name):
            super().__setattr__(name, value)
            if name == "training" and self.__dict__.get("_ortmod_ready"):
                self._original_module.training = value
            return
        # an attribute of the wrapped model (as ORT does): set it there and re-check the
        # export on the next call, since forward may branch on it
        setattr(self._original_module, name, value)
        self.__dict__["_ortmod_dirty"] = True

    def __delattr__(self, name):
        if self._ortmod_owns(name):
            return super().__delattr__(name)
        delattr(self._original_module, name)
        self.__dict__["_ortmod_dirty"] = True


# Attributes that DeepSpeed ZeRO-3's module hooks set on the module they hook (the ORTModule
# itself) on every call: their own bookkeeping, kept on the ORTModule. Forwarded to the wrapped
# model like its own attributes, each would mark the export dirty and re-export every step.
HOOK_BOOKKEEPING = frozenset({"applied_pre_backward_ref_cnt", "pre_bwd_fn", "post_bwd_fn"})


def add_inner_prefix(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                     error_msgs):
    inner = prefix + "_original_module."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in [k for k in metadata if k.startswith(prefix) and not k.startswith(inner.rstrip("."))]:
            rest = key[len(prefix):]
            metadata[inner.rstrip(".") + ("." + rest if rest else "")] = metadata[key]
