"""Training and inference steps of larger models than the corpus's: eager,
Inductor and kiln side by side in one process, and where kiln's time goes.

    HF_HUB_OFFLINE=1 KILN_BUILD_DIR=build-rel .venv/bin/python \\
        tests/bench/bench_models.py [--models gpt2,llama,...] [--modes train,infer]
        [--rounds 4] [--threads 2] [--top 3]

The corpus and bench_torch.py use small configs, where a kernel that scales
badly hides: this one builds each model at a size a 2-core machine still
trains in well under a second a step (random weights, nothing downloaded),
compiles it with backend="inductor" and backend="kiln" (a kilnd of its own
on a fresh store), and times the three backends' steps interleaved in
rounds (each round 3 steps of each; the median round is printed). kiln's
plan steps are timed by libkiln (Module.start_profile) over the same steps,
and the costliest are printed with the ATen op each runs, with the graphs'
fallback steps and any KilnWarning (a graph kiln did not take).

Models: gpt2 (GPT-2, 2 layers of width 768, vocabulary 8192, 4 x 256
tokens), llama (LLaMA, 2 layers of 512, 8192 tokens of vocabulary, 4 x
128), bert (BERT masked LM, 2 layers of 768, 8 x 128, padding masked),
vit (timm vit_small_patch16_224, batch 8), resnet50 (torchvision, batch 8
at 128²), convnext (timm convnext_nano, batch 8 at 128²), t5 (T5, 2 + 2
layers of 256, 4 x 64), swin (timm swin_tiny_patch4_window7_224, batch 2),
unet (a diffusion model's UNet in small, width 64, batch 8 at 64²: GroupNorm,
SiLU, attention over 32² positions, nearest upsampling; MSE loss), regnet
(timm regnety_008, batch 8 at 128²: 3x3 convolutions in groups of 16
channels, squeeze-excitation), convmixer (timm convmixer_768_32, batch 1
at 128²: 7x7 depthwise convolutions over 18²), densenet (torchvision
densenet121, batch 8 at 64²: every layer's 1x1 convolution reads the
concatenation of all the block's earlier outputs). Training is forward, loss,
backward and an SGD step; inference runs under torch.no_grad().
"""
import argparse
import copy
import os
import signal
import statistics
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build(name, train):
    """(model, call): call(f) runs one step's forward on the model f and
    returns the loss (train) or the output."""
    import torch
    torch.manual_seed(0)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=2, n_embd=768, n_head=12, vocab_size=8192, n_positions=256,
                         resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, bos_token_id=0,
                         eos_token_id=0)
        m = GPT2LMHeadModel(cfg)
        ids = torch.randint(0, 8192, (4, 256))
        return m, (lambda f: f(input_ids=ids, labels=ids).loss if train
                   else f(input_ids=ids).logits)
    if name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=2,
                          num_attention_heads=8, num_key_value_heads=4, vocab_size=8192,
                          max_position_embeddings=512)
        m = LlamaForCausalLM(cfg)
        ids = torch.randint(0, 8192, (4, 128))
        return m, (lambda f: f(input_ids=ids, labels=ids).loss if train
                   else f(input_ids=ids).logits)
    if name == "bert":
        from transformers import BertConfig, BertForMaskedLM
        cfg = BertConfig(num_hidden_layers=2, hidden_size=768, num_attention_heads=12,
                         intermediate_size=3072, vocab_size=8192, max_position_embeddings=256,
                         hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        m = BertForMaskedLM(cfg)
        ids = torch.randint(0, 8192, (8, 128))
        mask = torch.ones(8, 128, dtype=torch.long)
        mask[:, 100:] = 0
        return m, (lambda f: f(input_ids=ids, attention_mask=mask, labels=ids).loss if train
                   else f(input_ids=ids, attention_mask=mask).logits)
    if name in ("vit", "convnext", "resnet50"):
        if name == "resnet50":
            import torchvision
            m = torchvision.models.resnet50(num_classes=100)
            x = torch.randn(8, 3, 128, 128)
        else:
            import timm
            arch = "vit_small_patch16_224" if name == "vit" else "convnext_nano"
            m = timm.create_model(arch, pretrained=False, num_classes=100)
            x = torch.randn(8, 3, 224, 224) if name == "vit" else torch.randn(8, 3, 128, 128)
        return m, (lambda f: f(x).logsumexp(1).mean() if train else f(x))
    if name == "t5":
        from transformers import T5Config, T5ForConditionalGeneration
        cfg = T5Config(d_model=256, d_ff=1024, num_layers=2, num_decoder_layers=2, num_heads=4,
                       vocab_size=8192, dropout_rate=0.0, decoder_start_token_id=0,
                       pad_token_id=0)
        m = T5ForConditionalGeneration(cfg)
        ids = torch.randint(0, 8192, (4, 64))
        return m, (lambda f: f(input_ids=ids, labels=ids).loss if train
                   else f(input_ids=ids, decoder_input_ids=ids).logits)
    if name == "swin":
        import timm
        m = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False,
                              num_classes=100, drop_path_rate=0.0)
        x = torch.randn(2, 3, 224, 224)
        return m, (lambda f: f(x).logsumexp(1).mean() if train else f(x))
    if name in ("regnet", "convmixer"):
        import timm
        arch, b = ("regnety_008", 8) if name == "regnet" else ("convmixer_768_32", 1)
        m = timm.create_model(arch, pretrained=False, num_classes=100)
        x = torch.randn(b, 3, 128, 128)
        return m, (lambda f: f(x).logsumexp(1).mean() if train else f(x))
    if name == "densenet":
        import torchvision
        m = torchvision.models.densenet121(num_classes=100)
        x = torch.randn(8, 3, 64, 64)
        return m, (lambda f: f(x).logsumexp(1).mean() if train else f(x))
    if name == "unet":
        m = _unet()
        x, tgt = torch.randn(8, 3, 64, 64), torch.randn(8, 3, 64, 64)
        return m, (lambda f: torch.nn.functional.mse_loss(f(x), tgt) if train else f(x))
    raise SystemExit(f"bench_models: unknown model {name!r}")


def _unet(c=64):
    """A diffusion model's UNet in small: residual blocks of GroupNorm,
    SiLU and 3x3 convolutions, a strided convolution down, self-attention
    over the 32² positions, nearest 2x upsampling up, skip connections by
    concatenation."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Res(nn.Module):
        def __init__(s, ci, co):
            super().__init__()
            s.n1, s.c1 = nn.GroupNorm(8, ci), nn.Conv2d(ci, co, 3, padding=1)
            s.n2, s.c2 = nn.GroupNorm(8, co), nn.Conv2d(co, co, 3, padding=1)
            s.sk = nn.Conv2d(ci, co, 1) if ci != co else nn.Identity()

        def forward(s, x):
            h = s.c2(F.silu(s.n2(s.c1(F.silu(s.n1(x))))))
            return h + s.sk(x)

    class Attn(nn.Module):
        def __init__(s, ch):
            super().__init__()
            s.n, s.qkv, s.o = nn.GroupNorm(8, ch), nn.Conv2d(ch, 3 * ch, 1), nn.Conv2d(ch, ch, 1)

        def forward(s, x):
            b, ch, h, w = x.shape
            q, k, v = s.qkv(s.n(x)).reshape(b, 3, ch, h * w).unbind(1)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2))
            return x + s.o(a.transpose(1, 2).reshape(b, ch, h, w))

    class UNet(nn.Module):
        def __init__(s):
            super().__init__()
            s.inp = nn.Conv2d(3, c, 3, padding=1)
            s.d1, s.down = Res(c, c), nn.Conv2d(c, c, 3, stride=2, padding=1)
            s.d2, s.mid, s.m2 = Res(c, 2 * c), Attn(2 * c), Res(2 * c, 2 * c)
            s.u2, s.u1 = Res(4 * c, c), Res(2 * c, c)
            s.out = nn.Conv2d(c, 3, 3, padding=1)

        def forward(s, x):
            h1 = s.d1(s.inp(x))
            h2 = s.d2(s.down(h1))
            u = s.u2(torch.cat([s.m2(s.mid(h2)), h2], 1))
            u = F.interpolate(u, scale_factor=2, mode="nearest")
            return s.out(F.silu(s.u1(torch.cat([u, h1], 1))))

    return UNet()


MODELS = ["gpt2", "llama", "bert", "vit", "resnet50", "convnext", "t5", "swin", "unet", "regnet",
          "convmixer", "densenet"]


def stepper(base, call, backend, train):
    import torch
    m = copy.deepcopy(base)
    m.train(train)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    f = m if backend == "eager" else torch.compile(m, backend=backend)

    def step():
        if train:
            opt.zero_grad(set_to_none=True)
            loss = call(f)
            loss.backward()
            opt.step()
            return loss.detach()
        with torch.no_grad():
            return call(f)
    return step


def run(name, mode, rounds, top):
    import torch
    import kiln.runtime as kr
    train = mode == "train"
    mods = []
    orig = kr.Module.__init__

    def init(self, *a, **k):  # every artifact this model loads is profiled
        orig(self, *a, **k)
        mods.append(self)
    kr.Module.__init__ = init
    # a fresh Dynamo per model: the models share code objects (transformers'
    # attention functions, nn.Module's call), and past Dynamo's recompile
    # limit a frame runs eagerly for every backend
    torch._dynamo.reset()
    try:
        base, call = build(name, train)
        steps = {b: stepper(base, call, b, train) for b in ("eager", "inductor", "kiln")}
        first, warned = {}, []
        for b, s in steps.items():
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                t = time.perf_counter()
                s()
                s()
                first[b] = time.perf_counter() - t
            warned += [str(x.message) for x in w if type(x.message).__name__ == "KilnWarning"]
        for m in mods:
            m.start_profile()
        res = {b: [] for b in steps}
        for _ in range(rounds):
            for b, s in steps.items():
                t = time.perf_counter()
                for _ in range(3):
                    s()
                res[b].append((time.perf_counter() - t) / 3 * 1e3)
    finally:
        kr.Module.__init__ = orig
    rows, fb_ms = [], 0.0
    n_steps = rounds * 3
    import msgpack
    for gi, m in enumerate(mods):
        calls, ms = m.stop_profile()
        if not calls:
            continue
        data = getattr(m, "_kiln_data", None)  # the Graph v1 bytes (kiln.backend)
        nodes = msgpack.unpackb(data, raw=False).get("nodes", []) if data else []
        for i, st in enumerate(m.steps()):
            k, n = st.get("kernel"), st.get("node")
            kind = st.get("kind")
            if kind == "kernel" and isinstance(k, int):
                op = nodes[n].get("op", "") if isinstance(n, int) and n < len(nodes) else ""
                what = m._kernels[k].get("name") + (" " + op.split(".")[1] if op else "")
            else:
                what = "fallback " + str(st.get("op", "")).split(".")[1]
            t = ms[i] / n_steps
            if kind != "kernel":
                fb_ms += t
            rows.append((t, gi, what))
    rows.sort(reverse=True)
    med = {b: statistics.median(v) for b, v in res.items()}
    return {"model": name, "mode": mode, "ms": med, "first_s": first, "warned": warned,
            "kiln_steps_ms": sum(r[0] for r in rows), "fallback_ms": fb_ms,
            "top": rows[:top], "graphs": len(mods)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--modes", default="train,infer")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=3)
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    modes = [m for m in a.modes.split(",") if m]
    for m in models:
        if m not in MODELS:
            ap.error(f"unknown model {m!r} (models: {', '.join(MODELS)})")
    for m in modes:
        if m not in ("train", "infer"):
            ap.error(f"unknown mode {m!r} (train, infer)")
    if a.rounds < 1 or a.threads < 1:
        ap.error("--rounds and --threads take a positive count")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    build_dir = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
    os.environ.setdefault("KILND", os.path.join(build_dir, "daemon", "kilnd"))
    sys.path.insert(0, ROOT)
    import torch
    torch.set_num_threads(a.threads)
    os.environ["KILN_THREADS"] = str(a.threads)
    from tests.integration.conftest import Kilnd
    work = tempfile.mkdtemp(prefix="bench_models-")
    # a SIGTERM unwinds like ^C: the kilnd started here is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    d = Kilnd(work, store_dir=os.path.join(work, "store"), args=["--workers", "2"],
              env={"KILN_COMPILE_THREADS": ""}, socket_path=os.path.join(work, "k.sock"))
    d.start()
    os.environ["KILN_SOCKET"] = os.path.join(work, "k.sock")
    print(f"== steps (ms, median of {a.rounds} rounds of 3 steps each, the backends "
          f"interleaved; {a.threads} threads); kiln: its plan steps' total and the "
          f"costliest (graph, kernel or fallback step)")
    print(f"{'model':<9} {'mode':<6} {'eager':>8} {'inductor':>9} {'kiln':>8} "
          f"{'kiln/ind':>8} {'kiln/eag':>8} {'plan':>7} {'fallbk':>7}  costliest")
    try:
        for m in models:
            for mode in modes:
                r = run(m, mode, a.rounds, a.top)
                ms = r["ms"]
                top = ", ".join(f"{t:.2f} g{g} {w}" for t, g, w in r["top"])
                print(f"{m:<9} {mode:<6} {ms['eager']:>8.2f} {ms['inductor']:>9.2f} "
                      f"{ms['kiln']:>8.2f} {ms['kiln'] / ms['inductor']:>7.2f}x "
                      f"{ms['kiln'] / ms['eager']:>7.2f}x {r['kiln_steps_ms']:>7.2f} "
                      f"{r['fallback_ms']:>7.2f}  {top}", flush=True)
                for w in r["warned"]:
                    print(f"    KilnWarning: {w[:200]}")
    finally:
        d.stop()


if __name__ == "__main__":
    main()
