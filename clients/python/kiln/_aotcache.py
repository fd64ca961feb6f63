"""kiln's graphs in torch's AOTAutograd cache.

A warm first call in a fresh process spends most of its time re-tracing:
Dynamo's bytecode tracing and AOTAutograd's (functionalization, the joint
graph, the partition). Inductor skips the second with AOTAutogradCache,
which maps the Dynamo graph (and everything that can change what
AOTAutograd makes of it) to the compiled forward and backward and
AOTAutograd's runtime metadata. kiln uses the same cache: its compilers
return ``KilnOutput`` (an ``OutputCode``, what the cache stores), which
holds the Graph v1 bytes kiln exported. On a hit AOTAutograd does not
trace; ``post_compile`` hands the bytes to kilnd, which answers from its
store (a hit there too), and the artifact is loaded.

The entries live where torch keeps its own (``TORCHINDUCTOR_CACHE_DIR``,
``aotautograd/``) and follow torch's switches
(``torch._functorch.config.enable_autograd_cache``,
``torch.compiler.config.force_disable_caches``). Their keys carry a tag
(``torch.compiler.config.cache_key_tag``) naming kiln, the hash of this
package's sources, the mode and the dynamic setting, so kiln's entries and
Inductor's never answer for each other, and a changed exporter never
reuses bytes the old one made.

The key. torch's own (``autograd_cache_key``) hashes, besides the graph,
the inputs and the configs, the whole system: torch's sources, triton's,
the inductor config. Its first computation in a process imports Inductor's
code generators and hashes those sources: 2.2 s on the 2-core VM, more than
AOTAutograd's tracing of most models. While kiln's AOTAutograd call runs
(and only then: ``_tls.tag``), the key is kiln's own: the same check that
every op of the graph is one whose meaning its name fixes
(``check_cacheable``), then a hash of the graph's code (and its
submodules'), its tensor attributes, the inputs' tensor metadata (torch's
``extract_tensor_metadata_for_cache_key``), the AOTAutograd config, the
partitioner's estimator and solver, the fields of AOTConfig torch's key
reads, the grad, autocast (and its dtype), default-dtype and determinism
modes, torch's version and kiln's tag. A graph with higher-order ops,
non-tensor attributes, SymFloat/SymBool inputs or a joint custom pass
gets torch's key. Dynamic shapes keep torch's guards:
the entry's guard expressions are checked on lookup as before.
"""
import contextlib
import hashlib
import os
import threading

import torch
import torch._functorch._aot_autograd.autograd_cache as _ac
import torch._inductor.config
from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
from torch._inductor.output_code import OutputCode

_FORMAT = 1  # the layout of KilnOutput's pickled state
_source_hash = None
_tls = threading.local()  # .tag: set while kiln's AOTAutograd call runs on this thread


def _package_hash():
    """sha256 of this package's Python sources (the exporter is among them)."""
    global _source_hash
    if _source_hash is None:
        h = hashlib.sha256()
        here = os.path.dirname(os.path.abspath(__file__))
        for name in sorted(os.listdir(here)):
            if name.endswith(".py"):
                with open(os.path.join(here, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read() + b"\0")
        _source_hash = h.hexdigest()[:16]
    return _source_hash


def cache_tag(settings):
    """The cache_key_tag kiln's AOTAutograd entries are saved and found under."""
    user = torch.compiler.config.cache_key_tag
    mine = f"kiln/{_FORMAT}/{_package_hash()}/{settings.mode}/{settings.dynamic}"
    return f"{user}|{mine}" if user else mine


class KilnOutput(OutputCode):
    """One graph AOTAutograd compiled with kiln, in the form its cache keeps.

    runner: what runs it in this process (boxed); None after unpickling,
    until post_compile loads the artifact. data: the Graph v1 bytes, None
    for a graph that ran without kiln (a backward left to eager), which is
    not cached. gm: the ATen graph, kept (as torch keeps a backward's) so
    that an entry loaded where kilnd cannot answer still runs, eagerly."""

    def __init__(self, runner, kind, data=None, none_outputs=(), seeded=False, settings=None,
                 gm=None):
        super().__init__()
        self._runner = runner
        self._gm = gm
        self.gm_state = None
        self.nodes = (sum(1 for n in gm.graph.nodes if n.op == "call_function")
                      if gm is not None else None)
        self._boxed_call = True
        self.kind = kind
        self.data = data
        self.none_outputs = list(none_outputs)
        self.seeded = seeded
        self.format = _FORMAT
        self.package = _package_hash()
        # torch.compile's mode and kiln's dynamic flag, for a load outside a
        # kiln() call (torch's precompile loads entries at torch.compile)
        self.mode = settings.torch_mode if settings is not None else None
        self.dynamic = settings.dynamic if settings is not None else None

    def __call__(self, inputs):
        return self._runner(inputs)

    def __getstate__(self):
        # (also what copy.copy reads: the cache pickles a copy)
        if self._gm is not None and self.gm_state is None:
            self.gm_state = _reduce_gm(self._gm)
        state = dict(self.__dict__)
        state["_runner"] = None
        state["_gm"] = None
        return state

    def prepare_for_serialization(self):
        if self.data is None:
            raise BypassAOTAutogradCache(f"kiln: this {self.kind} graph ran without kiln")
        self._runner = None

    def current(self):
        """False for an entry this version of kiln cannot read (torch's
        precompile cache is keyed by the model's code, not kiln's)."""
        return (getattr(self, "format", None) == _FORMAT and self.data is not None
                and getattr(self, "package", None) == _package_hash())

    def eager(self):
        """The runner of the kept ATen graph (None when there is none)."""
        state = getattr(self, "gm_state", None)
        if state is None:
            return None
        fn, args = state
        gm = fn(*args)
        if not isinstance(gm, torch.fx.GraphModule):
            return None

        def run(args):
            outs = gm(*args)
            args.clear()
            return outs

        run._boxed_call = True
        return run

    def post_compile(self, example_inputs, constants, graph_kwargs):
        if self._runner is not None:
            return
        from .backend import _load_cached
        self._runner = _load_cached(self)

    def set_triton_bundle(self, triton_bundle):
        pass


def _reduce_gm(gm):
    """gm as torch pickles the backward module it keeps in an entry
    (serialize_graph_module): its code and attributes, without its meta
    (fake tensors; node metadata is not in the reduction). gm keeps its own."""
    meta = gm.meta
    gm.meta = {}
    try:
        fn, args = gm.__reduce__()
    finally:
        gm.meta = meta
    return fn, args


# ---------------------------------------------------------------------------
# the key


def _tensor_bytes(t):
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _kiln_key(gm, example_inputs, config):
    """kiln's AOTAutograd cache key, or None where torch's must be used."""
    from torch._inductor.codecache import extract_tensor_metadata_for_cache_key
    _ac.check_cacheable(gm)
    h = hashlib.sha256()

    def put(*parts):
        for p in parts:
            h.update(p if isinstance(p, bytes) else repr(p).encode())
            h.update(b"\0")

    for name, mod in gm.named_modules():
        if not isinstance(mod, torch.fx.GraphModule):
            return None
        put("module", name, mod.code)
        for n in mod.graph.nodes:
            if isinstance(n.target, torch._ops.HigherOrderOperator):
                return None
            if n.op == "get_attr":
                # a tensor or a submodule is hashed below; anything else
                # (a script object, ...) is left to torch's key
                v = mod
                for part in str(n.target).split("."):
                    v = getattr(v, part, None)
                if not isinstance(v, (torch.Tensor, torch.fx.GraphModule)):
                    return None
            tags = {k: n.meta[k] for k in ("recompute", "ac_graph_id", "partitioner_tag",
                                            "custom", "user_cache_hash") if k in n.meta}
            if tags:
                put("meta", n.name, sorted(tags.items(), key=lambda kv: kv[0]))
    for name, t in sorted(list(gm.named_parameters()) + list(gm.named_buffers())):
        put("tensor", name, extract_tensor_metadata_for_cache_key(t), _tensor_bytes(t))
    for k, v in sorted(gm.__dict__.items()):
        if isinstance(v, torch.Tensor):
            put("attr", k, extract_tensor_metadata_for_cache_key(v), _tensor_bytes(v))
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            put("input", type(x).__name__, extract_tensor_metadata_for_cache_key(x))
        elif isinstance(x, (torch.SymFloat, torch.SymBool)):
            return None  # torch's entry guards cover backed SymInts only
        else:
            put("input", type(x).__name__, str(x))
    cfg = torch._functorch.config
    if getattr(cfg, "joint_custom_pass", None) is not None:
        return None
    uuids = getattr(_ac, "_get_custom_estimator_solver_uuids", None)
    if uuids is not None:
        put("partitioner", uuids(cfg))
    elif (getattr(cfg, "activation_memory_budget_runtime_estimator", None) is not None
          or getattr(cfg, "activation_memory_budget_solver", None) is not None):
        return None
    put("aot", config.num_params_buffers, config.keep_inference_input_mutations,
        config.is_export, config.no_tangents, config.dynamic_shapes,
        config.aot_autograd_arg_pos_to_source, config.pre_dispatch)
    put("config", torch._functorch.config.save_config())
    put("modes", torch.is_grad_enabled(), torch._C._is_any_autocast_enabled(),
        torch.get_autocast_dtype("cpu"), torch.get_default_dtype(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.utils.deterministic.fill_uninitialized_memory)
    put("torch", torch.__version__, torch.version.git_version, _tls.tag)
    return "a" + h.hexdigest()


def _install():
    """Routes autograd_cache_key to _kiln_key while kiln's call runs on
    this thread; False when this torch has no such function."""
    orig = getattr(_ac, "autograd_cache_key", None)
    if orig is None:
        return False
    if getattr(orig, "_kiln", False):
        return True

    def autograd_cache_key(gm, example_inputs, config, fx_config, *args, **kwargs):
        if getattr(_tls, "tag", None) is not None and not args and not kwargs:
            key = _kiln_key(gm, example_inputs, config)
            if key is not None:
                return key, []
        return orig(gm, example_inputs, config, fx_config, *args, **kwargs)

    autograd_cache_key._kiln = True
    autograd_cache_key.__wrapped__ = orig
    _ac.autograd_cache_key = autograd_cache_key
    return True


def patches(settings):
    """The context around kiln's AOTAutograd call that puts its graphs in
    torch's cache. Raises (the caller then leaves the cache alone) where
    torch's local AOTAutograd cache is not in use or lacks a piece; builds
    everything that can fail before anything is patched.

    bundled: the entry holds kiln's KilnOutput itself (not an FX graph
    cache key); non-lazy backward: the entry is written while the patches
    hold (a lazy backward compiles, and saves, after they end)."""
    if not _ac.should_use_local_autograd_cache():
        raise RuntimeError("torch's AOTAutograd cache is off")
    if not torch._inductor.config.fx_graph_cache:
        raise RuntimeError("torch's FX graph cache is off (AOTAutograd's cache needs it)")
    cfg = torch._functorch.config
    for name in ("bundled_autograd_cache", "force_non_lazy_backward_lowering"):
        if not hasattr(cfg, name):
            raise RuntimeError(f"torch._functorch.config has no {name}")
    tag = cache_tag(settings)
    if not _install():
        raise RuntimeError("torch has no autograd_cache_key")
    return _patched(tag)


@contextlib.contextmanager
def _patched(tag):
    prior = getattr(_tls, "tag", None)
    _tls.tag = tag
    try:
        with torch._functorch.config.patch(bundled_autograd_cache=True,
                                           force_non_lazy_backward_lowering=True), \
                torch.compiler.config.patch(cache_key_tag=tag):
            yield
    finally:
        _tls.tag = prior
