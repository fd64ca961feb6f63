"""kiln: compile PyTorch graphs through the kilnd compilation server.

    import torch, kiln
    model = torch.compile(model, backend="kiln")   # or: kiln.compile(model)

Importing this package does not import torch; the functions below do.
See clients/python/README.md.
"""

__version__ = "0.1.0"
__all__ = ["compile", "explain", "KilnError", "KilnWarning", "__version__"]


def compile(model=None, **kwargs):
    """``torch.compile(model, backend="kiln", **kwargs)``: the same
    arguments (mode, dynamic, fullgraph, options, disable), the same
    effect. Usable as a decorator, with or without arguments."""
    import torch
    from . import backend
    if "backend" in kwargs and kwargs["backend"] not in ("kiln", backend.kiln):
        raise ValueError("kiln.compile: backend is kiln's; use torch.compile for another")
    kwargs.pop("backend", None)
    mode = kwargs.get("mode")
    if mode not in backend.MODES:
        raise ValueError(f"kiln.compile: unknown mode {mode!r}")
    if model is None:
        return lambda m: torch.compile(m, backend=backend.kiln, **kwargs)
    return torch.compile(model, backend=backend.kiln, **kwargs)


def explain(model, *args, train=False, **compile_kwargs):
    """Compiles model with kiln, runs it on args (and a backward pass when
    train=True), and returns a report (str() prints it): graphs, kernels,
    fallbacks, cache hits and misses, where the time went."""
    from ._explain import explain as _explain
    return _explain(model, *args, train=train, **compile_kwargs)


def __getattr__(name):
    if name == "KilnError":
        from .runtime import KilnError
        return KilnError
    if name == "KilnWarning":
        from .backend import KilnWarning
        return KilnWarning
    raise AttributeError(name)
