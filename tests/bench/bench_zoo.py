"""A wide, quick sweep: many architectures (torchvision, timm, Hugging Face;
small configs, random weights) through kiln against eager, each in its own
process, to find the model where kiln is wrong, falls back or is slow.

    HF_HUB_OFFLINE=1 KILN_BUILD_DIR=build-rel .venv/bin/python \\
        tests/bench/bench_zoo.py [--models densenet121,opt,...] [--modes infer,train]
        [--inductor] [--threads 2]

bench_models.py measures a dozen models at a realistic size; this one runs
forty at a small one (batch 2, 64² images or 32 tokens; some timm models
need 224²), so that a whole sweep takes minutes. Per model and mode it
prints the relative error of kiln's output against eager's (training: the
loss, the mean of the squared output, and the gradients of all parameters
together, ‖g_kiln − g_eager‖ / ‖g_eager‖, so that a parameter whose true
gradient is 0 cannot dominate), eager's and kiln's step (median of 5
steps, the better of two sets), their ratio, Inductor's with --inductor,
the first call's time, and every plan step kiln left to torch (fallback
ops) or graph it did not take (KilnWarning). Training uses dropout and
stochastic depth 0, so both backends compute the same function; a model
whose training has other randomness shows a loss error for that reason.
A model that fails in Dynamo itself (not in kiln) prints its error.

It found DenseNet-121's inference 5.5x slower than eager (masked loads
over its concatenations: compiler/README.md, "load_guarded_row").
"""
import argparse
import copy
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
             vocab_size=1000)


def _tv(fn, size=64, **kw):
    import torch
    import torchvision
    m = getattr(torchvision.models, fn)(**kw)
    x = torch.randn(2, 3, size, size)
    return m, (lambda f: f(x))


def _tvv(fn, **kw):
    """A torchvision video model on one clip of 4 frames, 56²."""
    import torch
    import torchvision
    m = getattr(torchvision.models.video, fn)(**kw)
    x = torch.randn(2, 3, 4, 56, 56)
    return m, (lambda f: f(x))


def _timm(fn, size=64, **kw):
    import timm
    import torch
    m = timm.create_model(fn, pretrained=False, **kw)
    x = torch.randn(2, 3, size, size)
    return m, (lambda f: f(x))


def _hf(cfg, cls, inputs=None, **kw):
    import torch
    import transformers
    m = getattr(transformers, cls)(getattr(transformers, cfg)(**kw))
    inputs = inputs or {"input_ids": torch.randint(0, 1000, (2, 32))}

    def call(f):
        out = f(**inputs)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state
    return m, call


def _lstm():
    import torch

    class L(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.e = torch.nn.Embedding(100, 32)
            self.rnn = torch.nn.LSTM(32, 64, 2, batch_first=True)
            self.o = torch.nn.Linear(64, 10)

        def forward(self, x):
            return self.o(self.rnn(self.e(x))[0])
    x = torch.randint(0, 100, (2, 16))
    return L(), (lambda f: f(x))


def _dcgan():
    """DCGAN's generator (Radford et al.): a 64-d code up to a 32x32 image by
    transposed convolutions, 4x4 at stride 2, batch_norm and relu between."""
    import torch
    nn = torch.nn

    def up(i, o, s=2, p=1):
        return [nn.ConvTranspose2d(i, o, 4, s, p, bias=False), nn.BatchNorm2d(o), nn.ReLU()]
    m = nn.Sequential(*up(64, 256, 1, 0), *up(256, 128), *up(128, 64),
                      nn.ConvTranspose2d(64, 3, 4, 2, 1), nn.Tanh())
    z = torch.randn(8, 64, 1, 1)
    return m, (lambda f: f(z))


def _unet():
    """A small U-Net (Ronneberger et al.): two 3x3 convolutions a level,
    max pooling down, 2x2 stride-2 transposed convolutions up, the skip
    connections concatenated."""
    import torch
    nn = torch.nn

    def block(i, o):
        return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(),
                             nn.Conv2d(o, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())

    class U(nn.Module):
        def __init__(self, ch=(16, 32, 64)):
            super().__init__()
            self.down = nn.ModuleList()
            c = 3
            for o in ch:
                self.down.append(block(c, o))
                c = o
            self.mid = block(ch[-1], ch[-1] * 2)
            self.up = nn.ModuleList()
            self.dec = nn.ModuleList()
            c = ch[-1] * 2
            for o in reversed(ch):
                self.up.append(nn.ConvTranspose2d(c, o, 2, 2))
                self.dec.append(block(2 * o, o))
                c = o
            self.out = nn.Conv2d(c, 2, 1)

        def forward(self, x):
            skips = []
            for d in self.down:
                x = d(x)
                skips.append(x)
                x = torch.nn.functional.max_pool2d(x, 2)
            x = self.mid(x)
            for u, d, s in zip(self.up, self.dec, reversed(skips)):
                x = d(torch.cat([u(x), s], 1))
            return self.out(x)
    x = torch.randn(2, 3, 64, 64)
    return U(), (lambda f: f(x))


def models():
    import torch
    r = {
        "densenet121": lambda: _tv("densenet121", num_classes=10),
        "squeezenet": lambda: _tv("squeezenet1_1", num_classes=10),
        "shufflenet": lambda: _tv("shufflenet_v2_x1_0", num_classes=10),
        "mnasnet": lambda: _tv("mnasnet0_5", num_classes=10),
        "efficientnet_b0": lambda: _tv("efficientnet_b0", num_classes=10),
        "mobilenet_v3": lambda: _tv("mobilenet_v3_small", num_classes=10),
        "googlenet": lambda: _tv("googlenet", num_classes=10, aux_logits=False,
                                 init_weights=True),
        "regnet_x": lambda: _tv("regnet_x_400mf", num_classes=10),
        "resnext50": lambda: _tv("resnext50_32x4d", num_classes=10),
        "alexnet": lambda: _tv("alexnet", size=96, num_classes=10),
        "vgg11_bn": lambda: _tv("vgg11_bn", num_classes=10),
        "tv_convnext": lambda: _tv("convnext_tiny", num_classes=10),
        "swin_t": lambda: _tv("swin_t", num_classes=10),
        "deit": lambda: _timm("deit_tiny_patch16_224", size=224, num_classes=10),
        "levit": lambda: _timm("levit_128s", size=224, num_classes=10),
        "poolformer": lambda: _timm("poolformer_s12", num_classes=10),
        "mobilevit": lambda: _timm("mobilevit_xxs", num_classes=10),
        "ghostnet": lambda: _timm("ghostnet_100", num_classes=10, drop_rate=0.0),
        "efficientformer": lambda: _timm("efficientformer_l1", size=224, num_classes=10),
        "mixer": lambda: _timm("mixer_s16_224", size=224, num_classes=10),
        "coat": lambda: _timm("coat_lite_tiny", size=224, num_classes=10),
        "convnextv2": lambda: _timm("convnextv2_atto", num_classes=10),
        "distilbert": lambda: _hf("DistilBertConfig", "DistilBertModel", n_layers=2, dim=64,
                                  n_heads=4, hidden_dim=128, vocab_size=1000),
        "roberta": lambda: _hf("RobertaConfig", "RobertaForMaskedLM", **SMALL),
        "albert": lambda: _hf("AlbertConfig", "AlbertForMaskedLM", embedding_size=32, **SMALL),
        "electra": lambda: _hf("ElectraConfig", "ElectraForPreTraining", embedding_size=32,
                               **SMALL),
        "deberta": lambda: _hf("DebertaV2Config", "DebertaV2Model", **SMALL),
        "mpnet": lambda: _hf("MPNetConfig", "MPNetForMaskedLM", **SMALL),
        "opt": lambda: _hf("OPTConfig", "OPTForCausalLM", num_hidden_layers=2, hidden_size=64,
                           num_attention_heads=4, ffn_dim=128, vocab_size=1000,
                           word_embed_proj_dim=64, dropout=0.0),
        "gpt_neo": lambda: _hf("GPTNeoConfig", "GPTNeoForCausalLM", num_layers=2,
                               attention_types=[[["global", "local"], 1]], hidden_size=64,
                               num_heads=4, vocab_size=1000, window_size=16),
        "gptj": lambda: _hf("GPTJConfig", "GPTJForCausalLM", n_layer=2, n_embd=64, n_head=4,
                            vocab_size=1000, rotary_dim=8),
        "bloom": lambda: _hf("BloomConfig", "BloomForCausalLM", n_layer=2, hidden_size=64,
                             n_head=4, vocab_size=1000),
        "mistral": lambda: _hf("MistralConfig", "MistralForCausalLM", num_key_value_heads=2,
                               **SMALL),
        "qwen2": lambda: _hf("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2, **SMALL),
        "phi": lambda: _hf("PhiConfig", "PhiForCausalLM", **SMALL),
        "bart": lambda: _hf("BartConfig", "BartForConditionalGeneration",
                            {"input_ids": torch.randint(0, 1000, (2, 16)),
                             "decoder_input_ids": torch.randint(0, 1000, (2, 12))},
                            encoder_layers=1, decoder_layers=1, d_model=64,
                            encoder_attention_heads=4, decoder_attention_heads=4,
                            encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=1000,
                            dropout=0.0),
        "wav2vec2": lambda: _hf("Wav2Vec2Config", "Wav2Vec2Model",
                                {"input_values": torch.randn(2, 4000)}, num_hidden_layers=2,
                                hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
                                conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                                num_conv_pos_embedding_groups=4, mask_time_prob=0.0),
        "clip_vision": lambda: _hf("CLIPVisionConfig", "CLIPVisionModel",
                                   {"pixel_values": torch.randn(2, 3, 64, 64)},
                                   num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                   intermediate_size=128, image_size=64, patch_size=8),
        "lstm": _lstm,
        "r3d": lambda: _tvv("r3d_18", num_classes=10),
        "dcgan": _dcgan,
        "unet": _unet,
    }
    return r


def _relerr(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / (b.norm() + 1e-30))


def child(name, mode, inductor):
    """One model and mode, in this process: prints one RESULT line (and
    FALLBACK / WARN lines)."""
    import torch
    sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
    import kiln.backend as kb
    torch.manual_seed(0)
    m, call = models()[name]()
    train = mode == "train"
    m.train(train)
    for mod in m.modules():  # the same function in every backend
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
        if type(mod).__name__ in ("DropPath", "StochasticDepth"):
            for a in ("drop_prob", "p"):
                if hasattr(mod, a):
                    setattr(mod, a, 0.0)

    def step(f):
        if not train:
            with torch.no_grad():
                return call(f)
        out = call(f)
        loss = out.float().pow(2).mean()
        loss.backward()
        return loss.detach()

    def grads(mod, other):
        # the parameters with a gradient in both: AOTAutograd (Inductor's
        # too) gives zeros where eager leaves None (a pooled output the
        # loss does not use: CLIP's post_layernorm)
        have = {n for n, p in other.named_parameters() if p.grad is not None}
        gs = [p.grad.flatten() for n, p in mod.named_parameters()
              if p.grad is not None and n in have]
        return torch.cat(gs) if gs else torch.zeros(1)

    me, mk = copy.deepcopy(m), copy.deepcopy(m)
    with warnings.catch_warnings(record=True) as wl:
        warnings.simplefilter("always")
        fk = torch.compile(mk, backend="kiln")
        t0 = time.perf_counter()
        outk = step(fk)
        first = time.perf_counter() - t0
        warned = sorted({str(w.message)[:200] for w in wl
                         if type(w.message).__name__ == "KilnWarning"})
    oute = step(me)
    line = f"out_err={_relerr(outk, oute):.1e}"
    if train:
        line += f" grad_err={_relerr(grads(mk, me), grads(me, mk)):.1e}"
    fi = mi = None
    if inductor:
        mi = copy.deepcopy(m)
        fi = torch.compile(mi, backend="inductor")
        step(fi)

    def timed(f, mod):
        best = None
        for _ in range(2):
            ts = []
            for _ in range(5):
                if train:
                    mod.zero_grad(set_to_none=True)
                t = time.perf_counter()
                step(f)
                ts.append(time.perf_counter() - t)
            med = statistics.median(ts) * 1e3
            best = med if best is None else min(best, med)
        return best
    te, tk = timed(me, me), timed(fk, mk)
    line += f" eager={te:.2f}ms kiln={tk:.2f}ms kiln/eager={tk / te:.2f}x"
    if inductor:
        ti = timed(fi, mi)
        line += f" inductor={ti:.2f}ms kiln/ind={tk / ti:.2f}x"
    print(f"RESULT {name:<16} {mode:<5} {line} first={first:.1f}s", flush=True)
    fops = {}
    for r in kb.records():
        for o in r.get("fallback_ops") or []:
            fops[o] = fops.get(o, 0) + 1
    if fops:
        print("  fallback ops: " + ", ".join(f"{o} x{c}" for o, c in sorted(fops.items())))
    for w in warned:
        print(f"  KilnWarning: {w}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="")
    ap.add_argument("--modes", default="infer,train")
    ap.add_argument("--inductor", action="store_true", help="time Inductor too (slower)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per model and mode")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        import torch
        torch.set_num_threads(a.threads)
        child(a.child[0], a.child[1], a.inductor)
        return
    names = list(models()) if not a.models else [m for m in a.models.split(",") if m]
    for n in names:
        if n not in models():
            ap.error(f"unknown model {n!r} (models: {', '.join(models())})")
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in ("infer", "train"):
            ap.error(f"unknown mode {m!r} (infer, train)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["KILN_THREADS"] = str(a.threads)
    build_dir = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
    os.environ.setdefault("KILND", os.path.join(build_dir, "daemon", "kilnd"))
    sys.path.insert(0, ROOT)
    from tests.integration.conftest import Kilnd
    work = tempfile.mkdtemp(prefix="bench_zoo-")
    # a SIGTERM unwinds like ^C: the kilnd started here is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    d = Kilnd(work, store_dir=os.path.join(work, "store"), args=["--workers", "2"],
              env={"KILN_COMPILE_THREADS": ""}, socket_path=os.path.join(work, "k.sock"))
    d.start()
    env = dict(os.environ, KILN_SOCKET=os.path.join(work, "k.sock"), KILN_AUTOSTART="0")
    print(f"== {len(names)} models x {modes}: kiln against eager (errors relative; steps "
          f"in ms, median of 5, the better of two sets; {a.threads} threads)", flush=True)
    try:
        for n in names:
            for mode in modes:
                cmd = [sys.executable, os.path.abspath(__file__), "--child", n, mode,
                       "--threads", str(a.threads)] + (["--inductor"] if a.inductor else [])
                try:
                    p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                       timeout=a.timeout)
                except subprocess.TimeoutExpired:
                    print(f"FAILED {n:<16} {mode:<5} timed out after {a.timeout} s", flush=True)
                    continue
                lines = [ln for ln in p.stdout.splitlines()
                         if ln.startswith(("RESULT", "  fallback", "  KilnWarning"))]
                if p.returncode != 0 or not lines:
                    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
                    why = next((ln for ln in reversed(err) if "Error" in ln),
                               err[-1] if err else f"exit {p.returncode}")
                    print(f"FAILED {n:<16} {mode:<5} {why.strip()[:200]}", flush=True)
                    continue
                print("\n".join(lines), flush=True)
    finally:
        d.stop()


if __name__ == "__main__":
    main()
