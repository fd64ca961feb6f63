"""Run kiln artifacts on torch tensors, through libkiln (ctypes).

The protocol and the artifact runtime are implemented once, in C
(clients/libkiln); this module only marshals torch tensors in and out:
inputs by data_ptr, output buffers allocated as torch tensors, outputs
returned as views of them (or of inputs, when the graph returns a view of an
input), and fallback steps executed through ``torch.ops.aten``.

    from kiln.runtime import Module
    m = Module(artifact_bytes)
    outs = m(*args)            # args: torch tensors and ints, in graph order
"""
import ctypes
import os

import torch

_DTYPES = ["f32", "f64", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "bool"]
_TORCH = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16,
          "bf16": torch.bfloat16, "i8": torch.int8, "i16": torch.int16,
          "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool}
_CODE = {v: i for i, v in enumerate(_DTYPES)}
_FROM_TORCH = {v: k for k, v in _TORCH.items()}
MAX_RANK = 16


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_uint32),
                ("sizes", ctypes.c_int64 * MAX_RANK), ("strides", ctypes.c_int64 * MAX_RANK)]


class IO(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("i", ctypes.c_int64), ("t", Tensor)]


FALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                            ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.c_size_t)


class RunOpts(ctypes.Structure):
    _fields_ = [("pool", ctypes.c_void_p), ("fallback", FALLBACK), ("user", ctypes.c_void_p)]


class KilnError(RuntimeError):
    pass


def _find_lib():
    cands = []
    if os.environ.get("KILN_LIB"):
        cands.append(os.environ["KILN_LIB"])
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    build = os.environ.get("KILN_BUILD_DIR", os.path.join(root, "build"))
    cands += [os.path.join(build, "clients", "libkiln.so"), "libkiln.so"]
    for c in cands:
        try:
            return ctypes.CDLL(c)
        except OSError:
            continue
    raise KilnError("libkiln.so not found (set KILN_LIB or KILN_BUILD_DIR)")


_lib = None


def lib():
    global _lib
    if _lib is None:
        L = _find_lib()
        L.kiln_module_load.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                       ctypes.c_size_t]
        L.kiln_module_free.argtypes = [ctypes.c_void_p]
        for f in ("kiln_module_n_inputs", "kiln_module_n_outputs", "kiln_module_n_out_buffers"):
            getattr(L, f).argtypes = [ctypes.c_void_p]
            getattr(L, f).restype = ctypes.c_uint32
        L.kiln_module_out_sizes.argtypes = [ctypes.c_void_p, ctypes.POINTER(IO), ctypes.c_uint32,
                                            ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p,
                                            ctypes.c_size_t]
        L.kiln_module_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(IO), ctypes.c_uint32,
                                      ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(IO),
                                      ctypes.POINTER(RunOpts), ctypes.c_char_p, ctypes.c_size_t]
        L.kiln_module_artifact.argtypes = [ctypes.c_void_p]
        L.kiln_module_artifact.restype = ctypes.c_void_p
        _lib = L
    return _lib


def _tensor_from(ptr, dtype_code, sizes, strides):
    """A torch tensor over raw memory (no copy): runtime-owned scratch."""
    dt = _TORCH[_DTYPES[dtype_code]]
    esize = torch.empty((), dtype=dt).element_size()
    span = 1
    for s, st in zip(sizes, strides):
        if s == 0:
            span = 0
            break
        span += (s - 1) * st
    nbytes = max(span, 0) * esize
    if nbytes == 0:
        return torch.empty(sizes, dtype=dt)
    buf = (ctypes.c_char * nbytes).from_address(ptr)
    flat = torch.frombuffer(buf, dtype=torch.uint8).view(dt)
    return flat.as_strided(sizes, strides)


class Module:
    """A loaded artifact. Call it with the graph's inputs (tensors, ints).

    fallback steps run through torch.ops.aten. Thread-safe like libkiln's
    kiln_module_run (each call allocates its own outputs)."""

    def __init__(self, artifact: bytes, none_outputs=()):
        L = lib()
        err = ctypes.create_string_buffer(1024)
        h = ctypes.c_void_p()
        rc = L.kiln_module_load(artifact, len(artifact), None, ctypes.byref(h), err, 1024)
        if rc != 0:
            raise KilnError(f"loading the artifact: {err.value.decode()}")
        self._h = h
        self.n_in = L.kiln_module_n_inputs(h)
        self.n_out = L.kiln_module_n_outputs(h)
        self.n_ob = L.kiln_module_n_out_buffers(h)
        self.none_outputs = sorted(none_outputs)
        import msgpack
        a = msgpack.unpackb(artifact, raw=False)
        self._steps = a.get("steps", [])
        self._cb = FALLBACK(self._fallback)
        self._error = None

    def __del__(self):
        if getattr(self, "_h", None) and _lib is not None:
            _lib.kiln_module_free(self._h)
            self._h = None

    # -- fallback steps through torch -------------------------------------
    def _fallback(self, user, art, step, views, err, errlen):
        try:
            st = self._steps[step]
            op = st["op"].split(".")
            fn = getattr(getattr(torch.ops, op[0]), op[1])
            fn = getattr(fn, op[2] if len(op) > 2 else "default")

            def view(k):
                t = views[k]
                return _tensor_from(t.data, t.dtype, list(t.sizes[:t.rank]),
                                    list(t.strides[:t.rank]))

            def conv(a):
                if isinstance(a, dict) and "ref" in a:
                    return view(a["ref"])
                if isinstance(a, list):
                    return [conv(x) for x in a]
                if isinstance(a, str) and a in _TORCH:
                    return _TORCH[a]
                return a
            args = [conv(x) for x in st.get("args", [])]
            kwargs = {k: conv(v) for k, v in st.get("kwargs", {}).items()}
            kwargs.pop("device", None)
            res = fn(*args, **kwargs)
            if isinstance(res, torch.Tensor):
                res = [res]
            outs = st.get("out", [])
            for r, k in zip([r for r in res if r is not None], outs):
                view(k).copy_(r)
            return 0
        except Exception as e:  # reported by the C side as a failed run
            self._error = e
            msg = f"fallback {self._steps[step].get('op')}: {e}".encode()[: errlen - 1]
            ctypes.memmove(err, msg + b"\0", len(msg) + 1)
            return -1

    # -- a call -----------------------------------------------------------
    def __call__(self, *args):
        L = lib()
        if len(args) != self.n_in:
            raise KilnError(f"expected {self.n_in} inputs, got {len(args)}")
        ins = (IO * max(self.n_in, 1))()
        keep = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.dtype not in _FROM_TORCH:
                    raise KilnError(f"input {i}: dtype {a.dtype} is not supported")
                ins[i].kind = 0
                t = ins[i].t
                t.data = a.data_ptr() if a.numel() else 0
                t.dtype = _CODE[_FROM_TORCH[a.dtype]]
                t.rank = a.dim()
                for d in range(a.dim()):
                    t.sizes[d] = a.shape[d]
                    t.strides[d] = a.stride(d)
                keep.append(a)
            else:
                ins[i].kind = 1
                ins[i].i = int(a)
        err = ctypes.create_string_buffer(1024)
        sizes = (ctypes.c_size_t * max(self.n_ob, 1))()
        rc = L.kiln_module_out_sizes(self._h, ins, self.n_in, sizes, err, 1024)
        if rc != 0:
            raise KilnError(err.value.decode())
        # output buffers as torch tensors (8-byte multiples: viewable as
        # any dtype); torch's CPU allocator aligns them to 64 bytes
        bufs = [torch.empty((int(sizes[k]) + 7) // 8 * 8 or 8, dtype=torch.uint8)
                for k in range(self.n_ob)]
        ptrs = (ctypes.c_void_p * max(self.n_ob, 1))()
        for k, b in enumerate(bufs):
            ptrs[k] = b.data_ptr()
        outs = (IO * max(self.n_out, 1))()
        opts = RunOpts(None, self._cb, None)
        self._error = None
        rc = L.kiln_module_run(self._h, ins, self.n_in, ptrs, outs, ctypes.byref(opts), err, 1024)
        if rc != 0:
            raise KilnError(err.value.decode()) from self._error
        result = []
        for k in range(self.n_out):
            o = outs[k]
            if o.kind == 1:
                result.append(o.i)
                continue
            t = o.t
            sz = list(t.sizes[:t.rank])
            st = list(t.strides[:t.rank])
            dt = _TORCH[_DTYPES[t.dtype]]
            result.append(self._wrap(t.data, dt, sz, st, bufs, ptrs, keep))
        for pos in self.none_outputs:
            result.insert(pos, None)
        return result

    @staticmethod
    def _wrap(ptr, dt, sz, st, bufs, ptrs, inputs):
        """The output as a view of the torch tensor that holds it."""
        es = torch.empty((), dtype=dt).element_size()
        if any(s == 0 for s in sz):
            return torch.empty(sz, dtype=dt)
        for b in bufs:
            base = b.data_ptr()
            if base <= ptr < base + b.numel():
                return b.view(dt).as_strided(sz, st, (ptr - base) // es)
        for a in inputs:
            sbase = a.untyped_storage().data_ptr()
            if sbase <= ptr < sbase + a.untyped_storage().nbytes() and a.dtype == dt:
                return a.as_strided(sz, st, (ptr - sbase) // es)
        raise KilnError("an output points outside every buffer")
