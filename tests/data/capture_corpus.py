#!/usr/bin/env python3
"""Capture kiln's corpus of real PyTorch 2 graphs into tests/data/graphs/.

    HF_HUB_OFFLINE=1 .venv/bin/python tests/data/capture_corpus.py [NAME ...]

Each model (random weights, built from configs: no network) is compiled with
Dynamo + AOTAutograd using capturing compilers, with ``fullgraph=True`` so a
graph break is an error rather than a silently dropped graph.  For each
captured ATen graph NAME_{fwd,bwd} we write

  NAME.graph.msgpack  the Graph v1 map (clients/python/kiln/export.py)
  NAME.io.msgpack     example inputs and the outputs the captured GraphModule
                      itself computed for exactly those inputs
                      (tests/data/README.md)

and index.json.  Everything is deterministic: fixed seeds, dropout 0, inputs
from kiln's test PRNG (clients/python/kiln/testrng.py).
"""

import json
import math
import os
import sys
import zlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))

import msgpack  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch._dynamo  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402

from kiln import testrng  # noqa: E402
from kiln.export import DTYPE_NAMES, export_graph, dumps  # noqa: E402

OUT_DIR = os.path.join(HERE, "graphs")
LITERAL_MAX = 4096  # inputs with at most this many elements are stored as data
DEFAULT_RTOL, DEFAULT_ATOL = 1e-4, 1e-5

NP_DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16,
             "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
             "u8": np.uint8, "bool": np.bool_}
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


# --------------------------------------------------------------------------
# capture

class Capture:
    """Dynamo backend whose AOT compilers record every graph they are given
    and the real arguments of its first call, then run it eagerly."""

    def __init__(self):
        self.graphs = []  # dicts: kind, gm, example_inputs, args (real, first call)
        self.backend = aot_autograd(fw_compiler=self._compiler("fwd"),
                                    bw_compiler=self._compiler("bwd"))

    def _compiler(self, kind):
        def compiler(gm, example_inputs):
            rec = {"kind": kind, "gm": gm, "example_inputs": list(example_inputs)}
            self.graphs.append(rec)

            def run(args):
                if "args" not in rec:
                    rec["args"] = [a.detach().clone() if isinstance(a, torch.Tensor) else a
                                   for a in args]
                return gm(*args)

            run._boxed_call = True  # what make_boxed_func does
            return run
        return compiler


def capture(fn, args, train, dynamic_dims=(), loss_fn=None):
    """Compiles fn with a Capture backend (fullgraph) and runs it once.

    train: run forward + backward (loss_fn(output) or output.float().pow(2).mean()
    eagerly when fn does not return a scalar).  Otherwise run under no_grad (an
    inference graph).  dynamic_dims: (arg index, dim) pairs to mark dynamic.
    Returns the Capture (fwd graph first, then bwd)."""
    torch._dynamo.reset()
    cap = Capture()
    for i, d in dynamic_dims:
        torch._dynamo.mark_dynamic(args[i], d)
    compiled = torch.compile(fn, backend=cap.backend, fullgraph=True,
                             dynamic=False if not dynamic_dims else None)
    if train:
        out = compiled(*args)
        if isinstance(out, torch.Tensor) and out.dim() == 0 and loss_fn is None:
            loss = out
        else:
            loss = (loss_fn or _default_loss)(out)
        loss.backward()
    else:
        with torch.no_grad():
            compiled(*args)
    kinds = [g["kind"] for g in cap.graphs]
    want = ["fwd", "bwd"] if train else ["fwd"]
    if kinds != want:
        raise RuntimeError(f"expected graphs {want}, captured {kinds}")
    for g in cap.graphs:
        if "args" not in g:
            raise RuntimeError(f"{g['kind']} graph was compiled but never run")
    return cap


def _default_loss(out):
    outs = out if isinstance(out, (list, tuple)) else [out]
    return sum(o.float().pow(2).mean() for o in outs if isinstance(o, torch.Tensor))


# --------------------------------------------------------------------------
# io files

def _nice(x):
    return float(f"{x:.6g}")


def gen_range(real):
    """[lo, hi) for a uniform PRNG stand-in matching the real tensor's scale."""
    r = real.detach().double().flatten()
    if r.numel() == 0:
        return -1.0, 1.0
    m = float(r.mean())
    s = float(r.std(unbiased=False)) if r.numel() > 1 else 0.0
    if s <= 1e-6 * max(1.0, abs(m)):
        if abs(m) < 1e-12:
            return -0.1, 0.1
        lo, hi = (0.5 * m, 1.5 * m) if m > 0 else (1.5 * m, 0.5 * m)
    else:
        lo, hi = m - math.sqrt(3.0) * s, m + math.sqrt(3.0) * s
        if float(r.min()) >= 0.0:  # keep non-negative tensors (variances) >= 0
            lo = max(lo, 0.0)
            if lo == 0.0 and float(r.min()) > 0.0:
                lo = float(r.min()) * 0.5
    return _nice(lo), _nice(hi)


def tensor_entry_data(t):
    t = t.detach().contiguous().cpu()
    name = DTYPE_NAMES[t.dtype]
    if name == "bf16":
        data = t.view(torch.int16).numpy().astype("<i2").tobytes()
    else:
        data = t.numpy().astype(np.dtype(NP_DTYPES[name]).newbyteorder("<")).tobytes()
    return {"dtype": name, "shape": list(t.shape), "data": data}


def entry_to_tensor(e):
    """An io-file tensor entry as a contiguous torch tensor."""
    dt = e["dtype"]
    shape = tuple(e["shape"])
    if "data" in e:
        if dt == "bf16":
            a = np.frombuffer(e["data"], dtype="<i2").reshape(shape)
            return torch.from_numpy(a.copy()).view(torch.bfloat16)
        a = np.frombuffer(e["data"], dtype=np.dtype(NP_DTYPES[dt]).newbyteorder("<"))
        return torch.from_numpy(a.astype(NP_DTYPES[dt]).reshape(shape).copy())
    a = testrng.generate(e["gen"], dt, shape)
    if dt == "bf16":
        return torch.from_numpy(a.astype(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True, order="C"))  # (ascontiguousarray makes 0-d 1-d)


def _eval_dim(d, symvals):
    if isinstance(d, int):
        return d
    # GRAPH.md expressions are Python expressions (// floor division, % Python modulo)
    return int(eval(d, {"__builtins__": {}, "max": max, "min": min}, dict(symvals)))


def graph_inputs(graph, io):
    """The io inputs as the GraphModule's runtime args, laid out with the
    graph's strides."""
    args = []
    symvals = io.get("symbols", {})
    for spec, e in zip(graph["inputs"], io["inputs"]):
        if "int" in e:
            args.append(int(e["int"]))
            continue
        t = entry_to_tensor(e)
        if "strides" in spec:
            strides = [_eval_dim(s, symvals) for s in spec["strides"]]
            lay = torch.empty_strided(t.shape, strides, dtype=t.dtype)
            lay.copy_(t)
            t = lay
        args.append(t)
    return args


def run_graph(gm, args):
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        out = gm(*args)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def output_entries(outs):
    res = []
    for o in outs:
        if o is None:
            continue
        if isinstance(o, torch.Tensor):
            res.append(tensor_entry_data(o))
        else:
            res.append({"int": int(o)})
    return res


class _Upcast(torch.fx.Interpreter):
    """Runs an ATen graph in f64: f32 tensors and dtype args become f64."""

    def call_function(self, target, args, kwargs):
        def up(a):
            if isinstance(a, torch.Tensor) and a.dtype == torch.float32:
                return a.double()
            if a is torch.float32:
                return torch.float64
            if isinstance(a, (list, tuple)):
                return type(a)(up(x) for x in a) if not isinstance(a, torch.Size) else a
            return a
        return target(*up(args), **{k: up(v) for k, v in kwargs.items()})


def measure_tol(gm, args, outs32):
    """(rtol, atol): DEFAULT_RTOL and an atol twice the worst gap between
    torch's f32 result and its f64 result beyond rtol, at least DEFAULT_ATOL."""
    try:
        a64 = [a.double() if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a
               for a in args]
        with torch.no_grad():
            outs64 = _Upcast(gm).run(*a64)
    except Exception as ex:  # some op without an f64 kernel: keep the defaults
        print(f"    (f64 reference failed: {type(ex).__name__}: {ex}; default tolerance)")
        return DEFAULT_RTOL, DEFAULT_ATOL, None
    need = 0.0
    for o32, o64 in zip(outs32, outs64):
        if not isinstance(o32, torch.Tensor) or not o32.is_floating_point():
            continue
        if o32.numel() == 0:
            continue
        d = (o32.double() - o64.double()).abs()
        need = max(need, float((2.0 * d - DEFAULT_RTOL * o64.double().abs()).max()))
    atol = DEFAULT_ATOL
    while atol < need:
        atol *= 10.0 ** 0.5
    atol = float(f"{atol:.2g}")
    return DEFAULT_RTOL, atol, need


def build_io(name, graph, gm, inputs_entries, symvals):
    io = {"format": "kiln.io/1", "symbols": symvals, "inputs": inputs_entries}
    args = graph_inputs(graph, io)
    outs = run_graph(gm, args)
    none_pos = [i for i, o in enumerate(outs) if o is None]
    if none_pos != graph.get("none_outputs", []):
        raise RuntimeError(f"{name}: None outputs {none_pos} != graph's {graph.get('none_outputs')}")
    io["outputs"] = output_entries(outs)
    if none_pos:
        io["none_outputs"] = none_pos
    rtol, atol, need = measure_tol(gm, args, outs)
    io["rtol"], io["atol"] = rtol, atol
    if need is not None:
        print(f"    {name}: f32 vs f64 reference needs atol {need:.2g} at rtol {rtol}")
    return io, outs


def fwd_input_entries(name, gm, real_args):
    """PRNG stand-ins for the forward graph's real inputs."""
    base = (zlib.crc32(name.encode()) & 0xFFFFFFFF) << 16
    entries = []
    for i, a in enumerate(real_args):
        if not isinstance(a, torch.Tensor):
            entries.append({"int": int(a)})
            continue
        dt = DTYPE_NAMES[a.dtype]
        shape = list(a.shape)
        if a.is_floating_point():
            lo, hi = gen_range(a)
            e = {"dtype": dt, "shape": shape,
                 "gen": {"kind": "uniform", "seed": base + i, "lo": lo, "hi": hi}}
            if a.numel() <= LITERAL_MAX:
                e = tensor_entry_data(entry_to_tensor(e))
        else:  # integer / bool inputs (token ids, counters): the real values
            e = tensor_entry_data(a)
        entries.append(e)
    return entries


def bwd_input_entries(name, fw_gm, fw_outs, bw_gm, real_bw_args):
    """Backward inputs: saved values from running the forward graph, tangents
    from the PRNG; all stored as data."""
    base = ((zlib.crc32(name.encode()) & 0xFFFFFFFF) << 16) + 0x8000
    out_node = next(n for n in fw_gm.graph.nodes if n.op == "output")
    fw_out_names = [(r.name if isinstance(r, torch.fx.Node) else None) for r in out_node.args[0]]
    entries = []
    ph = [n for n in bw_gm.graph.nodes if n.op == "placeholder"]
    for i, (n, real) in enumerate(zip(ph, real_bw_args)):
        if n.name.startswith("tangents"):
            if not isinstance(real, torch.Tensor):
                raise RuntimeError(f"{name}: tangent {n.name} is not a tensor")
            dt = DTYPE_NAMES[real.dtype]
            e = {"dtype": dt, "shape": list(real.shape),
                 "gen": {"kind": "uniform", "seed": base + i, "lo": -1.0, "hi": 1.0}}
            entries.append(tensor_entry_data(entry_to_tensor(e)))
            continue
        if n.name not in fw_out_names:
            raise RuntimeError(f"{name}: backward input {n.name} is not a forward output")
        v = fw_outs[fw_out_names.index(n.name)]
        if isinstance(real, torch.Tensor):
            if not isinstance(v, torch.Tensor) or v.shape != real.shape or v.dtype != real.dtype:
                raise RuntimeError(f"{name}: backward input {n.name} does not match the saved value")
            entries.append(tensor_entry_data(v))
        else:
            if isinstance(v, torch.Tensor) or int(v) != int(real):
                raise RuntimeError(f"{name}: backward int input {n.name}: {v} != {real}")
            entries.append({"int": int(v)})
    return entries


def write_msgpack(path, obj):
    with open(path, "wb") as f:
        f.write(dumps(obj))


def export_capture(model, cap, out_dir=OUT_DIR, dynamic=False):
    """Writes the graph + io files of a Capture; returns index entries."""
    index = []
    fw = cap.graphs[0]
    fw_name = f"{model}_fwd"
    fw_graph = export_graph(fw["gm"], fw["example_inputs"])
    symvals = {k: v["hint"] for k, v in fw_graph.get("symbols", {}).items()}
    fw_io, fw_outs = build_io(fw_name, fw_graph, fw["gm"],
                              fwd_input_entries(fw_name, fw["gm"], fw["args"]), symvals)
    files = [(fw_name, "fwd", fw_graph, fw_io)]
    if len(cap.graphs) > 1:
        bw = cap.graphs[1]
        bw_name = f"{model}_bwd"
        bw_graph = export_graph(bw["gm"], bw["example_inputs"])
        bsyms = {k: v["hint"] for k, v in bw_graph.get("symbols", {}).items()}
        entries = bwd_input_entries(bw_name, fw["gm"], fw_outs, bw["gm"], bw["args"])
        bw_io, _ = build_io(bw_name, bw_graph, bw["gm"], entries, bsyms)
        files.append((bw_name, "bwd", bw_graph, bw_io))
    for name, kind, graph, io in files:
        gpath = os.path.join(out_dir, f"{name}.graph.msgpack")
        ipath = os.path.join(out_dir, f"{name}.io.msgpack")
        write_msgpack(gpath, graph)
        write_msgpack(ipath, io)
        ops = sorted({n["op"] for n in graph["nodes"]})
        index.append({
            "name": name, "model": model, "kind": kind,
            "graph": os.path.basename(gpath), "io": os.path.basename(ipath),
            "nodes": len(graph["nodes"]), "inputs": len(graph["inputs"]),
            "outputs": len(graph["outputs"]), "dynamic": dynamic or bool(graph.get("symbols")),
            "symbols": sorted(graph.get("symbols", {})),
            "none_outputs": graph.get("none_outputs", []),
            "rtol": io["rtol"], "atol": io["atol"],
            "ops": ops,
        })
        print(f"  {name}: {len(graph['nodes'])} nodes, {len(ops)} ops, "
              f"graph {os.path.getsize(gpath)} B, io {os.path.getsize(ipath)} B, "
              f"rtol {io['rtol']} atol {io['atol']}")
    return index


# --------------------------------------------------------------------------
# models

def _prng_input(seed, shape, lo=-1.0, hi=1.0):
    return torch.from_numpy(testrng.uniform(seed, shape, lo, hi, "f32"))


def _prng_ids(seed, shape, hi):
    return torch.from_numpy(testrng.randint(seed, shape, 0, hi, "i64"))


def model_mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 16))
    return m, (_prng_input(1, (8, 32)),), True, ()


def model_cnn():
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 10))
    m.train()
    return m, (_prng_input(2, (2, 3, 16, 16)),), True, ()


def model_resnet18():
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.resnet18(weights=None).eval()
    return m, (_prng_input(3, (1, 3, 64, 64)),), False, ()


def _encoder_layer():
    torch.manual_seed(0)
    m = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                   batch_first=True)
    m.train()  # dropout is 0; train mode keeps the fused inference fast path out
    return m


def model_transformer_layer():
    return _encoder_layer(), (_prng_input(4, (2, 16, 64)),), True, ()


def model_transformer_dyn():
    return _encoder_layer(), (_prng_input(5, (2, 16, 64)),), False, ((0, 1),)


def model_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0,
                     use_cache=False, bos_token_id=0, eos_token_id=0)
    m = GPT2LMHeadModel(cfg)
    m.loss_type = "ForCausalLM"  # else an unknown-loss warning (logger call) breaks the graph
    m.train()
    return GPT2WithLoss(m), (_prng_ids(6, (2, 16), 512),), True, ()


# the wrappers are module-level classes: torch's precompile cache refuses a
# model whose class is local to a function


class GPT2WithLoss(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids, labels=ids, use_cache=False).loss


class BertOutputs(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids, mask):
        o = self.inner(input_ids=ids, attention_mask=mask)
        return o.last_hidden_state, o.pooler_output


def model_bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                     intermediate_size=128, vocab_size=512, max_position_embeddings=64,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = BertModel(cfg).eval()
    ids = _prng_ids(7, (2, 16), 512)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0  # a padded second sequence
    return BertOutputs(m), (ids, mask), False, ()


def model_vit():
    from timm.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    m = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                          num_classes=10, drop_rate=0.0, attn_drop_rate=0.0,
                          drop_path_rate=0.0).eval()
    return m, (_prng_input(8, (2, 3, 32, 32)),), False, ()


def model_mobilenet_v2():
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.mobilenet_v2(weights=None, width_mult=0.5).eval()
    return m, (_prng_input(9, (1, 3, 64, 64)),), False, ()


def model_efficientnet():
    import timm
    torch.manual_seed(0)
    m = timm.create_model("efficientnet_b0", pretrained=False, num_classes=10,
                          drop_rate=0.0, drop_path_rate=0.0).eval()
    return m, (_prng_input(10, (1, 3, 64, 64)),), False, ()


MODELS = {
    "mlp": model_mlp,
    "cnn": model_cnn,
    "resnet18": model_resnet18,
    "transformer_layer": model_transformer_layer,
    "gpt2": model_gpt2,
    "bert": model_bert,
    "vit": model_vit,
    "transformer_dyn": model_transformer_dyn,
    "mobilenet_v2": model_mobilenet_v2,
    "efficientnet": model_efficientnet,
}


def main(argv):
    names = argv[1:] or list(MODELS)
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.use_deterministic_algorithms(True, warn_only=True)
    index_path = os.path.join(OUT_DIR, "index.json")
    old = []
    if argv[1:] and os.path.exists(index_path):
        with open(index_path) as f:
            old = [e for e in json.load(f)["graphs"] if e["model"] not in names]
    index = []
    for name in names:
        print(f"{name}:")
        m, args, train, dyn = MODELS[name]()
        cap = capture(m, args, train, dyn)
        index += export_capture(name, cap, dynamic=bool(dyn))
    order = {n: i for i, n in enumerate(MODELS)}
    allg = sorted(old + index, key=lambda e: (order.get(e["model"], 99), e["kind"] != "fwd"))
    with open(index_path, "w") as f:
        json.dump({"format": "kiln.corpus/1", "torch": torch.__version__,
                   "graphs": allg}, f, indent=1)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(OUT_DIR, p)) for p in os.listdir(OUT_DIR))
    print(f"corpus: {len(allg)} graphs, {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main(sys.argv)
