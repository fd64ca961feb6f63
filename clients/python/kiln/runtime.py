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
import shutil
import subprocess
import sys
import threading

import torch

from . import ops as _ops  # noqa: F401  (torch.ops.kiln.*, for fallback steps)

_DTYPES = ["f32", "f64", "f16", "bf16", "i8", "i16", "i32", "i64", "u8", "bool"]
_TORCH = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16,
          "bf16": torch.bfloat16, "i8": torch.int8, "i16": torch.int16,
          "i32": torch.int32, "i64": torch.int64, "u8": torch.uint8, "bool": torch.bool}
_CODE = {v: i for i, v in enumerate(_DTYPES)}
_FROM_TORCH = {v: k for k, v in _TORCH.items()}
_empty = torch.empty
_empty_strided = torch.empty_strided
_u8 = torch.uint8
MAX_RANK = 16


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_uint32),
                ("sizes", ctypes.c_int64 * MAX_RANK), ("strides", ctypes.c_int64 * MAX_RANK)]


class IO(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("i", ctypes.c_int64), ("t", Tensor)]


FALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32,
                            ctypes.POINTER(Tensor), ctypes.c_void_p, ctypes.c_size_t)


class RunOpts(ctypes.Structure):
    # kiln.h kiln_run_opts_t, field for field (step_ms: NULL, no profile)
    _fields_ = [("pool", ctypes.c_void_p), ("fallback", FALLBACK), ("user", ctypes.c_void_p),
                ("step_ms", ctypes.POINTER(ctypes.c_double))]


class KilnError(RuntimeError):
    """A libkiln call failed. ``code`` is the envelope's error-code name
    ("busy", "unsupported_op", "invalid_graph", ...; "internal" for a
    system error), ``rc`` libkiln's return code (0 when not from libkiln)."""

    def __init__(self, message, code="internal", rc=0, node=None):
        super().__init__(message)
        self.code = code
        self.rc = rc
        self.node = node


class ClientOpts(ctypes.Structure):
    _fields_ = [("socket", ctypes.c_char_p), ("timeout_ms", ctypes.c_int),
                ("connect_timeout_ms", ctypes.c_int), ("autostart", ctypes.c_int),
                ("kilnd_path", ctypes.c_char_p), ("autostart_idle_s", ctypes.c_uint32),
                ("cache_bytes", ctypes.c_size_t), ("cache_disable", ctypes.c_bool)]


class Result(ctypes.Structure):
    _fields_ = [("artifact", ctypes.c_void_p), ("artifact_len", ctypes.c_size_t),
                ("signature", ctypes.c_char * 65), ("source", ctypes.c_char * 16),
                ("compile_ms", ctypes.c_double), ("err_node", ctypes.c_int64)]


_libc = ctypes.CDLL(None)
# protocol.h's kiln_op_t, in PROTOCOL.md's order
OPS = {"hello": 0, "compile": 1, "lookup": 2, "status": 3, "list": 4, "evict": 5, "gc": 6,
       "shutdown": 7}
# transport failures (-errno, KILN_ETIMEOUT): the daemon is down or unreachable
_ERRNO_DOWN = {2, 32, 104, 110, 111, 112, 113}


def _lib_candidates():
    """Where libkiln.so may be, in order: $KILN_LIB; the build tree
    ($KILN_BUILD_DIR, else build/ of the checkout this package lives in or
    of the checkout whose .venv runs us); the install prefix (pkg-config's
    libdir for kiln, sys.prefix, /usr/local, /usr); the loader's path.
    A generator: pkg-config (a process, 8 ms) runs only when the build
    tree has none."""
    if os.environ.get("KILN_LIB"):
        yield os.environ["KILN_LIB"]
    here = os.path.dirname(os.path.abspath(__file__))
    roots = [os.path.dirname(os.path.dirname(os.path.dirname(here))),
             os.path.dirname(sys.prefix)]
    if os.environ.get("KILN_BUILD_DIR"):
        yield os.path.join(os.environ["KILN_BUILD_DIR"], "clients", "libkiln.so")
    for r in roots:
        yield os.path.join(r, "build", "clients", "libkiln.so")
    libdirs = []
    try:
        r = subprocess.run(["pkg-config", "--variable=libdir", "kiln"], capture_output=True,
                           text=True, timeout=5)
        if r.returncode == 0 and r.stdout.strip():
            libdirs.append(r.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    for pre in (sys.prefix, "/usr/local", "/usr"):
        libdirs += [os.path.join(pre, "lib", "x86_64-linux-gnu"), os.path.join(pre, "lib")]
    for d in libdirs:
        yield os.path.join(d, "libkiln.so")
    yield "libkiln.so"


def _find_lib():
    tried = []
    for c in _lib_candidates():
        if os.path.isabs(c) and not os.path.exists(c):
            tried.append(c)
            continue
        try:
            L = ctypes.CDLL(c)
            L._kiln_path = c
            return L
        except OSError as e:
            tried.append(f"{c} ({e})")
    raise KilnError("libkiln.so not found: build kiln (meson) or install it, or set KILN_LIB; "
                    "looked in " + ", ".join(tried))


def kilnd_path():
    """The kilnd a client auto-starts: $KILND, the one next to the libkiln
    in use (build tree: ../daemon/kilnd; prefix: ../../bin or ../../sbin),
    else "kilnd" in $PATH (None: let libkiln decide)."""
    if os.environ.get("KILND"):
        return os.environ["KILND"]
    d = os.path.dirname(os.path.abspath(getattr(lib(), "_kiln_path", "") or "."))
    for c in (os.path.join(d, "..", "daemon", "kilnd"), os.path.join(d, "..", "..", "bin", "kilnd"),
              os.path.join(d, "..", "..", "sbin", "kilnd"), os.path.join(d, "..", "bin", "kilnd")):
        if os.access(c, os.X_OK):
            return os.path.normpath(c)
    return shutil.which("kilnd")


_lib = None


def lib():
    global _lib
    if _lib is None:
        L = _find_lib()
        L.kiln_module_load.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p,
                                       ctypes.c_size_t]
        L.kiln_module_free.argtypes = [ctypes.c_void_p]
        for f in ("kiln_module_n_inputs", "kiln_module_n_outputs", "kiln_module_n_out_buffers",
                  "kiln_module_n_steps"):
            getattr(L, f).argtypes = [ctypes.c_void_p]
            getattr(L, f).restype = ctypes.c_uint32
        L.kiln_module_out_sizes.argtypes = [ctypes.c_void_p, ctypes.POINTER(IO), ctypes.c_uint32,
                                            ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p,
                                            ctypes.c_size_t]
        L.kiln_module_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(IO), ctypes.c_uint32,
                                      ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(IO),
                                      ctypes.POINTER(RunOpts), ctypes.c_char_p, ctypes.c_size_t]
        L.kiln_expr_eval_str.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p),
                                         ctypes.POINTER(ctypes.c_int64), ctypes.c_uint32,
                                         ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p,
                                         ctypes.c_size_t]
        L.kiln_fallback_syms.argtypes = [ctypes.POINTER(ctypes.c_uint32)]
        L.kiln_fallback_syms.restype = ctypes.POINTER(ctypes.c_int64)
        L.kiln_module_artifact.argtypes = [ctypes.c_void_p]
        L.kiln_module_artifact.restype = ctypes.c_void_p
        # the kilnd client (kiln.h section 4)
        L.kiln_client_opts_init.argtypes = [ctypes.POINTER(ClientOpts)]
        L.kiln_client_connect.argtypes = [ctypes.POINTER(ClientOpts), ctypes.POINTER(ctypes.c_void_p),
                                          ctypes.c_char_p, ctypes.c_size_t]
        L.kiln_client_free.argtypes = [ctypes.c_void_p]
        L.kiln_client_socket.argtypes = [ctypes.c_void_p]
        L.kiln_client_socket.restype = ctypes.c_char_p
        L.kiln_client_compile_bytes.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                                ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                                                ctypes.POINTER(Result), ctypes.c_char_p,
                                                ctypes.c_size_t]
        L.kiln_result_free.argtypes = [ctypes.POINTER(Result)]
        L.kiln_client_call.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                                       ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p,
                                       ctypes.c_size_t]
        L.kiln_blas_corename.argtypes = [ctypes.c_char_p]
        L.kiln_blas_corename.restype = ctypes.c_char_p
        L.kiln_blas_coretype.argtypes = []
        L.kiln_blas_coretype.restype = ctypes.c_char_p
        L.kiln_pool_default.argtypes = []
        L.kiln_pool_default.restype = ctypes.c_void_p
        L.kiln_pool_kind.argtypes = [ctypes.c_void_p]
        L.kiln_pool_kind.restype = ctypes.c_char_p
        L.kiln_pool_threads.argtypes = [ctypes.c_void_p]
        L.kiln_pool_threads.restype = ctypes.c_uint
        L.kiln_err_wire_name.argtypes = [ctypes.c_int]
        L.kiln_err_wire_name.restype = ctypes.c_char_p
        _libc.free.argtypes = [ctypes.c_void_p]
        _lib = L
    return _lib


def blas_core():
    """The kernels the OpenBLAS kiln's products call runs in this process
    ("SkylakeX", "Haswell"), once a product has loaded it; None before
    that, or where the BLAS is not OpenBLAS. libkiln sets
    OPENBLAS_CORETYPE from the CPU's features before loading any kernel
    (clients/libkiln/README.md, BLAS), unless it is set already."""
    path = os.environ.get("KILN_BLAS")
    r = lib().kiln_blas_corename(path.encode() if path else None)
    return r.decode() if r else None


def pool():
    """Where kiln's kernels run in this process: ("openmp", n) on the
    OpenMP team torch's own ops use (libgomp, loaded by torch; n follows
    torch.set_num_threads unless KILN_THREADS is set), or ("kiln", n) on
    libkiln's own threads (KILN_POOL=own, or no GNU OpenMP in the process).
    clients/libkiln/README.md, Threads."""
    L = lib()
    p = L.kiln_pool_default()
    return L.kiln_pool_kind(p).decode(), int(L.kiln_pool_threads(p))


def eval_expr(expr, env):
    """The value of a Graph v1 integer expression (GRAPH.md: + - * // %
    min max, Python's floor semantics) with symbol values env, by libkiln's
    own parser (kiln_expr_eval_str)."""
    if isinstance(expr, int):
        return expr
    if not isinstance(expr, str):
        raise KilnError(f"bad symbolic expression {expr!r}")
    L = lib()
    names = list(env)
    n = len(names)
    cnames = (ctypes.c_char_p * max(n, 1))(*[k.encode() for k in names])
    vals = (ctypes.c_int64 * max(n, 1))(*[int(env[k]) for k in names])
    out = ctypes.c_int64()
    err = ctypes.create_string_buffer(256)
    rc = L.kiln_expr_eval_str(expr.encode(), cnames, vals, n, ctypes.byref(out), err, 256)
    if rc != 0:
        raise KilnError(err.value.decode(errors="replace") or f"expression {expr!r}",
                        code="invalid_graph", rc=rc)
    return out.value


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


def _index_put_separable(x, indices, values, accumulate=False):
    """index_put(x, indices, values, accumulate=True) as one index_add per
    indexed dim, where that is the same sum: adjacent index tensors, the
    i-th varying along the broadcast shape's dim i alone, every index >= 0
    (index_add takes no negative one). A nearest upsampling's backward is
    such an index_put ([None, None, rows [H, 1], cols [W]]): torch's
    accumulating index_put took 15.4 ms on [8, 128, 64, 64] -> [8, 128,
    32, 32] (2 threads), the index_adds 2.4. The sums are in another
    order, so the result may differ in rounding. None where it does not
    apply (the caller runs the op as it is)."""
    if (not accumulate or not isinstance(x, torch.Tensor) or not isinstance(values, torch.Tensor)
            or x.dtype == torch.bool or x.is_complex()):
        return None
    pos = [k for k, t in enumerate(indices) if t is not None]
    if (not pos or pos != list(range(pos[0], pos[0] + len(pos)))
            or any(indices[k].dtype not in (torch.int64, torch.int32) for k in pos)
            or values.dtype != x.dtype):
        return None
    ts = [indices[k] for k in pos]
    n = len(ts)
    try:
        b = torch.broadcast_shapes(*(t.shape for t in ts))
    except RuntimeError:
        return None
    if len(b) != n:
        return None
    flat = []
    for i, t in enumerate(ts):
        t = t.reshape((1,) * (n - t.dim()) + tuple(t.shape))
        if any(t.shape[d] != 1 for d in range(n) if d != i) or t.shape[i] != b[i]:
            return None
        flat.append(t.reshape(-1))
    first = pos[0]
    full = tuple(x.shape[:first]) + tuple(b) + tuple(x.shape[first + n:])
    try:
        v = values.expand(full)
    except RuntimeError:
        return None
    if any(bool((f < 0).any()) or bool((f >= x.shape[first + i]).any())
           for i, f in enumerate(flat)):
        return None
    for i in reversed(range(n)):
        d = first + i
        shape = list(v.shape)
        shape[d] = x.shape[d]
        v = torch.zeros(shape, dtype=v.dtype).index_add_(d, flat[i], v)
    return x + v


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
        self._kernels = a.get("kernels", [])
        self.signature = a.get("signature") or ""
        self._sym_names = list(a.get("symbols") or {})
        self._cb = FALLBACK(self._fallback)
        self._opts = ctypes.byref(RunOpts(None, self._cb, None))
        self._tls = threading.local()
        self._error = None
        self._prof = None  # profiling: [step_ms array, calls]

    # -- profiling (kiln.explain) ------------------------------------------
    def start_profile(self):
        """From now on every call adds each plan step's wall time to a
        running total (libkiln's kiln_run_opts_t.step_ms, what kilnc
        --profile prints). The totals are plain adds: profile one thread's
        calls."""
        n = max(lib().kiln_module_n_steps(self._h), 1)
        arr = (ctypes.c_double * n)()
        self._prof = [arr, 0]
        self._opts = ctypes.byref(RunOpts(None, self._cb, None,
                                          ctypes.cast(arr, ctypes.POINTER(ctypes.c_double))))

    def stop_profile(self):
        """Ends profiling; returns (calls, [ms of each plan step, summed
        over the calls]), or (0, []) when it was not on."""
        p, self._prof = self._prof, None
        self._opts = ctypes.byref(RunOpts(None, self._cb, None))
        if p is None:
            return 0, []
        return p[1], [p[0][i] for i in range(len(self._steps))]

    def steps(self):
        """The plan's steps (dicts of the artifact: kind, kernel, node, op)."""
        return list(self._steps)

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

            env = None

            def conv(a):
                nonlocal env
                if isinstance(a, dict) and "ref" in a:
                    return view(a["ref"])
                if isinstance(a, dict) and "sym" in a:
                    if env is None:
                        n = ctypes.c_uint32()
                        p = _lib.kiln_fallback_syms(ctypes.byref(n))
                        env = {name: p[i] for i, name in enumerate(self._sym_names)
                               if i < n.value}
                    return eval_expr(a["sym"], env)
                if isinstance(a, list):
                    return [conv(x) for x in a]
                if isinstance(a, str) and a in _TORCH:
                    return _TORCH[a]
                return a
            args = [conv(x) for x in st.get("args", [])]
            kwargs = {k: conv(v) for k, v in st.get("kwargs", {}).items()}
            kwargs.pop("device", None)
            res = None
            if op[1] in ("index_put", "_unsafe_index_put") and not kwargs:
                try:
                    res = _index_put_separable(*args)
                except Exception:  # the op itself then says what is wrong
                    res = None
            if res is None:
                res = fn(*args, **kwargs)
            if isinstance(res, torch.Tensor):
                res = [res]
            outs = st.get("out", [])
            # out[i] is the schema's output i; a None result (an output the
            # op was told not to compute) has an empty placeholder view
            for r, k in zip(res, outs):
                if r is not None:
                    view(k).copy_(r)
            return 0
        except Exception as e:  # reported by the C side as a failed run
            self._error = e
            msg = f"fallback {self._steps[step].get('op')}: {e}".encode()[: errlen - 1]
            ctypes.memmove(err, msg + b"\0", len(msg) + 1)
            return -1

    # -- a call -----------------------------------------------------------
    # A call fills the libkiln input array, asks for the output buffer
    # sizes, allocates them as torch tensors, runs, and wraps the outputs
    # as views. Per thread, the last call's input layout (shape, strides,
    # dtype of each tensor, value of each int) is remembered with the
    # output sizes and where each output lives: a call with the same layout
    # (every step of a training loop) only writes the data pointers,
    # allocates and runs -- the layout is still compared input by input, so
    # a tensor that differs takes the full path and libkiln checks it.
    #
    # The fast path writes the data pointers through int64 views of the
    # argument arrays (no ctypes wrapper objects), allocates an out buffer
    # that holds exactly one output directly as that output (empty_strided:
    # no uint8 buffer, no view), and returns it as is.
    def __call__(self, *args):
        tl = self._tls
        st = getattr(tl, "st", None)
        if st is None:
            st = tl.st = _CallState(self)
        lay = st.layout
        fast = lay is not None and len(args) == len(lay)
        if fast:
            dp = st.dp
            di = st.di
            for i, a in enumerate(args):
                want = lay[i]
                if type(want) is tuple:
                    if a.shape != want[0] or a.dtype is not want[2] or a.stride() != want[1]:
                        fast = False
                        break
                    dp[di[i]] = a.data_ptr()
                elif a != want:
                    fast = False
                    break
        if not fast:
            if len(args) != self.n_in:
                raise KilnError(f"expected {self.n_in} inputs, got {len(args)}")
            self._fill(args, st)
        makers = st.makers
        if makers is None:
            bufs = [torch.empty(n, dtype=torch.uint8) for n in st.sizes]
        else:
            bufs = [_empty_strided(m[0], m[1], dtype=m[2]) if m[3] else _empty(m[0], dtype=_u8)
                    for m in makers]
        pp = st.pp
        for k, b in enumerate(bufs):
            pp[k] = b.data_ptr()
        outs = st.outs
        self._error = None
        if self._prof is not None:
            self._prof[1] += 1
        rc = _lib.kiln_module_run(self._h, st.ins, self.n_in, st.ptrs, outs, self._opts,
                                  st.err, 1024)
        if rc != 0:
            st.layout = None
            raise KilnError(st.err.value.decode(), code=_lib.kiln_err_wire_name(rc).decode(),
                            rc=rc) from self._error
        where = st.where
        first = where is None
        if first:
            where = self._locate(args, bufs, outs)
        result = []
        for w in where:
            kind = w[0]
            if kind == 4:    # the whole out buffer b, made as this output: (4, b)
                result.append(bufs[w[1]])
            elif kind == 0:  # in out buffer b: (0, b, dtype, sizes, strides, offset)
                result.append(bufs[w[1]].view(w[2]).as_strided(w[3], w[4], w[5]))
            elif kind == 1:  # an int
                result.append(w[1])
            elif kind == 2:  # a view of input i: (2, i, dtype, sizes, strides, delta)
                a = args[w[1]]
                result.append(a.as_strided(w[3], w[4], a.storage_offset() + w[5]))
            else:            # empty: (3, dtype, sizes)
                result.append(torch.empty(w[2], dtype=w[1]))
        if first:
            st.makers, st.where = self._makers(where, st.sizes)
        for pos in self.none_outputs:
            result.insert(pos, None)
        return result

    def _makers(self, where, sizes):
        """How the fast path allocates each out buffer: (sizes, strides,
        dtype, True) where exactly one output lives in it, at offset 0, and
        its strided span covers the buffer; else (nbytes, None, None,
        False). Returns them with ``where`` for the next calls, where the
        outputs of such buffers are (4, b)."""
        where = list(where)
        count = [0] * len(sizes)
        for w in where:
            if w[0] == 0:
                count[w[1]] += 1
        makers = [(n, None, None, False) for n in sizes]
        for j, w in enumerate(where):
            if w[0] != 0 or count[w[1]] != 1 or w[5] != 0:
                continue
            b, dt, sz, strd = w[1], w[2], w[3], w[4]
            if any(x < 0 for x in strd):
                continue
            span = 1 + sum((n - 1) * x for n, x in zip(sz, strd))
            if (span * dt.itemsize + 7) // 8 * 8 < sizes[b]:
                continue
            makers[b] = (sz, strd, dt, True)
            where[j] = (4, b)
        return makers, where

    def _fill(self, args, st):
        """The full path: every input written, checked by libkiln, the
        output sizes computed; the layout remembered for the next call."""
        ins = st.ins
        lay = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.dtype not in _FROM_TORCH:
                    raise KilnError(f"input {i}: dtype {a.dtype} is not supported")
                if a.device.type != "cpu":
                    raise KilnError(f"input {i}: a {a.device.type} tensor; kiln runs on the CPU")
                ins[i].kind = 0
                t = ins[i].t
                t.data = a.data_ptr() if a.numel() else 0
                t.dtype = _CODE[_FROM_TORCH[a.dtype]]
                t.rank = a.dim()
                stride = a.stride()
                for d in range(a.dim()):
                    t.sizes[d] = a.shape[d]
                    t.strides[d] = stride[d]
                # an empty tensor's data pointer is not written on the fast path
                lay.append((a.shape, stride, a.dtype) if a.numel() else None)
            else:
                ins[i].kind = 1
                ins[i].i = int(a)
                lay.append(int(a))
        st.layout = None
        st.where = None
        st.makers = None
        sizes = (ctypes.c_size_t * max(self.n_ob, 1))()
        rc = _lib.kiln_module_out_sizes(self._h, ins, self.n_in, sizes, st.err, 1024)
        if rc != 0:
            raise KilnError(st.err.value.decode(), code=_lib.kiln_err_wire_name(rc).decode(),
                            rc=rc)
        # 8-byte multiples: viewable as any dtype; torch's CPU allocator
        # aligns them to 64 bytes
        st.sizes = [(int(sizes[k]) + 7) // 8 * 8 or 8 for k in range(self.n_ob)]
        st.layout = None if any(x is None for x in lay) else lay

    def _locate(self, args, bufs, outs):
        """Where each output lives, relative to its out buffer or input."""
        where = []
        for k in range(self.n_out):
            o = outs[k]
            if o.kind == 1:
                where.append((1, o.i))
                continue
            t = o.t
            sz = tuple(t.sizes[:t.rank])
            st = tuple(t.strides[:t.rank])
            dt = _TORCH[_DTYPES[t.dtype]]
            es = dt.itemsize
            if any(s == 0 for s in sz):
                where.append((3, dt, sz))
                continue
            ptr = t.data
            for b, buf in enumerate(bufs):
                base = buf.data_ptr()
                if base <= ptr < base + buf.numel():
                    where.append((0, b, dt, sz, st, (ptr - base) // es))
                    break
            else:
                for i, a in enumerate(args):
                    if not isinstance(a, torch.Tensor) or a.dtype != dt or not a.numel():
                        continue
                    sbase = a.untyped_storage().data_ptr()
                    if sbase <= ptr < sbase + a.untyped_storage().nbytes():
                        where.append((2, i, dt, sz, st, (ptr - a.data_ptr()) // es))
                        break
                else:
                    raise KilnError("an output points outside every buffer")
        return where


class Client:
    """A connection to kilnd through libkiln (kiln.h section 4): the
    protocol, the signature, the in-process artifact cache, reconnects and
    kilnd's auto-start are libkiln's. Thread-safe (libkiln serializes calls
    on one handle). ``socket`` None: kilnd's default discovery."""

    def __init__(self, socket=None, timeout_ms=0, connect_timeout_ms=0, autostart=-1):
        L = lib()
        o = ClientOpts()
        L.kiln_client_opts_init(ctypes.byref(o))
        self._keep = []
        if socket:
            o.socket = socket.encode()
        o.timeout_ms = int(timeout_ms)
        o.connect_timeout_ms = int(connect_timeout_ms)
        o.autostart = int(autostart)
        kp = kilnd_path()
        if kp:
            o.kilnd_path = kp.encode()
        self._keep.append(o)
        err = ctypes.create_string_buffer(1024)
        h = ctypes.c_void_p()
        rc = L.kiln_client_connect(ctypes.byref(o), ctypes.byref(h), err, 1024)
        if rc != 0:
            raise _error(rc, err, "connecting to kilnd")
        self._h = h
        self.pid = os.getpid()
        self.socket = L.kiln_client_socket(h).decode()

    def close(self):
        if getattr(self, "_h", None) and _lib is not None and self.pid == os.getpid():
            _lib.kiln_client_free(self._h)
        self._h = None

    def __del__(self):
        self.close()

    def compile(self, graph_bytes, mode="default", dynamic=None, priority=None):
        """Graph v1 bytes → (artifact bytes, signature, source, compile_ms).
        dynamic: None (kilnd's automatic dynamic shapes), False, True."""
        L = lib()
        r = Result()
        err = ctypes.create_string_buffer(1024)
        dyn = -1 if dynamic is None else int(bool(dynamic))
        rc = L.kiln_client_compile_bytes(self._h, graph_bytes, len(graph_bytes),
                                         (mode or "default").encode(), dyn,
                                         priority.encode() if priority else None,
                                         ctypes.byref(r), err, 1024)
        if rc != 0:
            node = r.err_node if r.err_node >= 0 else None
            L.kiln_result_free(ctypes.byref(r))
            raise _error(rc, err, "compile", node)
        try:
            art = ctypes.string_at(r.artifact, r.artifact_len)
            return art, r.signature.decode(), r.source.decode(), r.compile_ms
        finally:
            L.kiln_result_free(ctypes.byref(r))

    def call(self, op, **fields):
        """Any op; returns the reply map (KilnError on an error reply)."""
        import msgpack
        L = lib()
        body = msgpack.packb(fields, use_bin_type=True) if fields else None
        rep = ctypes.c_void_p()
        n = ctypes.c_size_t()
        err = ctypes.create_string_buffer(1024)
        rc = L.kiln_client_call(self._h, OPS[op], body, len(body) if body else 0,
                                ctypes.byref(rep), ctypes.byref(n), err, 1024)
        if rc != 0:
            raise _error(rc, err, op)
        try:
            return msgpack.unpackb(ctypes.string_at(rep.value, n.value), raw=False)
        finally:
            _libc.free(rep)


def _error(rc, err, what, node=None):
    code = lib().kiln_err_wire_name(rc).decode()
    if -rc in _ERRNO_DOWN or code == "timeout":
        code = "unavailable" if code != "timeout" else code
    msg = err.value.decode(errors="replace") or f"{what} failed ({rc})"
    return KilnError(msg, code=code, rc=rc, node=node)


class _CallState:
    """One thread's reusable call arrays and layout cache for a Module."""

    def __init__(self, m):
        n_in, n_ob = max(m.n_in, 1), max(m.n_ob, 1)
        # the argument arrays live in bytearrays, so that the fast path
        # writes pointers through int64 memoryviews of the same bytes
        self._inb = bytearray(ctypes.sizeof(IO) * n_in)
        self.ins = (IO * n_in).from_buffer(self._inb)
        self.dp = memoryview(self._inb).cast("q")
        off = IO.t.offset + Tensor.data.offset
        self.di = [(i * ctypes.sizeof(IO) + off) // 8 for i in range(n_in)]
        self._pb = bytearray(8 * n_ob)
        self.ptrs = (ctypes.c_void_p * n_ob).from_buffer(self._pb)
        self.pp = memoryview(self._pb).cast("Q")
        self.outs = (IO * max(m.n_out, 1))()
        self.err = ctypes.create_string_buffer(1024)
        self.layout = None
        self.sizes = []
        self.where = None
        self.makers = None
