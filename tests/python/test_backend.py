"""torch.compile(model, backend="kiln"): numerics against eager, through a real kilnd.

Every model is built from a config with random weights (seeded) and run
from identical copies three ways: eagerly in f32, eagerly in f64 (the
exact reference), and compiled with backend="kiln" (AOTAutograd's forward
and backward graphs compiled by kilnd, run by libkiln). kiln must match
eager within a tolerance, or be at least as close to the exact answer as
eager is. Tolerances (documented in clients/python/README.md), elementwise:

    |kiln - exact| <= atol + rtol * |exact| + 2 * |eager - exact|

* inference outputs: rtol 1e-4, atol 1e-5;
* 5 training steps, SGD (lr 0.01) and AdamW (lr 1e-3): every loss with
  rtol 1e-4, atol 1e-6; every parameter and buffer (BatchNorm statistics)
  with rtol 1e-4, atol 1e-5 -- for AdamW's parameters atol 5 * lr (the
  farthest 5 steps can move an element whose gradient is rounding noise).

Why the eager term: f32 training amplifies rounding. kiln reassociates
reductions (vectorized, pairwise) and so rounds differently from eager; in
BatchNorm's backward (a difference of nearly equal terms) and in AdamW
(which normalizes a gradient that is zero up to rounding -- a conv bias
before a BatchNorm -- into a full +-lr step) either f32 result can sit
several percent from the exact one. There kiln must not be worse than
eager; everywhere else it must match eager to the tolerance.

No test may fall back: a KilnWarning fails the test (filterwarnings=error).
"""
import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

pytestmark = [pytest.mark.filterwarnings("error::kiln.backend.KilnWarning"),
              pytest.mark.usefixtures("kiln_daemon")]


# ---- the models (small configs, random weights) ------------------------------

def _x(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g) * 2 - 1


def _ids(seed, shape, hi):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, hi, shape, generator=g)


def mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 16))
    return m, (_x(1, 8, 32),)


def cnn():
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 4 * 4, 10))
    return m, (_x(2, 2, 3, 16, 16),)


def resnet18():
    import torchvision
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None, num_classes=10), (_x(3, 4, 3, 64, 64),)


def mobilenet_v2():
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.mobilenet_v2(weights=None, width_mult=0.5, num_classes=10,
                                         dropout=0.0)
    return m, (_x(4, 4, 3, 64, 64),)


def transformer_layer():
    torch.manual_seed(0)
    m = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                   batch_first=True)
    return m, (_x(5, 2, 16, 64),)


class _HF(nn.Module):
    """A Hugging Face model returning one tensor (or its loss)."""

    def __init__(self, inner, loss):
        super().__init__()
        self.inner = inner
        self.loss = loss

    def forward(self, ids, mask=None):
        if self.loss:
            return self.inner(input_ids=ids, labels=ids, use_cache=False).loss
        o = self.inner(input_ids=ids, attention_mask=mask)
        return o.last_hidden_state


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                     bos_token_id=0, eos_token_id=0)
    m = GPT2LMHeadModel(cfg)
    m.loss_type = "ForCausalLM"
    return _HF(m, loss=True), (_ids(6, (2, 16), 512),)


def bert():
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                     intermediate_size=128, vocab_size=512, max_position_embeddings=64,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0
    return _HF(BertModel(cfg, add_pooling_layer=False), loss=False), (_ids(7, (2, 16), 512), mask)


def convnext():
    import timm
    torch.manual_seed(0)
    m = timm.create_model("convnext_atto", pretrained=False, num_classes=10, drop_rate=0.0,
                          drop_path_rate=0.0)
    return m, (_x(8, 2, 3, 32, 32),)


MODELS = {f.__name__: f for f in (mlp, cnn, resnet18, mobilenet_v2, transformer_layer, gpt2,
                                  bert, convnext)}


# ---- helpers -------------------------------------------------------------------

def _loss(out):
    if isinstance(out, (tuple, list)):
        out = out[0]
    if out.dim() == 0:
        return out
    return out.pow(2).mean()


def _train(model, args, opt_name, steps, compiled):
    model.train()
    m = torch.compile(model, backend="kiln") if compiled else model
    if opt_name == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = _loss(m(*args))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float64)


def _f64(args):
    return tuple(a.double() if a.is_floating_point() else a for a in args)


def _close(ours, eager, exact, rtol, atol, what):
    ours, eager, exact = (t.detach().double() for t in (ours, eager, exact))
    allowed = atol + rtol * exact.abs() + 2 * (eager - exact).abs()
    err = (ours - exact).abs()
    bad = err > allowed
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} of {bad.numel()} elements off; worst: kiln "
        f"{ours[bad][0].item():.8g}, eager {eager[bad][0].item():.8g}, "
        f"exact {exact[bad][0].item():.8g}")


def _no_fallback():
    import kiln.backend as kb
    s = kb.stats()
    assert s["fallback"] == 0, [r for r in kb.records() if r["why"]]
    for r in kb.records():
        assert r["source"] in ("compiled", "memory", "disk", "joined", "local", "process"), r
    assert s["graphs"] >= 1


# ---- numerics against eager ------------------------------------------------------

@pytest.mark.parametrize("name", list(MODELS))
def test_inference_matches_eager(name):
    model, args = MODELS[name]()
    model.eval()
    exact = copy.deepcopy(model).double()
    with torch.no_grad():
        want = model(*args)
        ref = exact(*_f64(args))
        got = torch.compile(model, backend="kiln")(*args)
    _close(got, want, ref, 1e-4, 1e-5, "output")
    _no_fallback()


# mobilenet_v2 (width 0.5, batch 4, 64x64) trains in f64 here. In f32 its
# five-step trajectory is chaotic for every backend: an activation 2e-5 from
# ReLU6's kink in a BatchNorm channel of near-zero batch variance flips its
# gradient mask on f32 rounding, and 1/sqrt(var+eps) amplifies the flip
# (traced in kiln: each graph alone matches eager ATen; eager's own f32
# losses leave the f64 ones by 30% at step 4). Inductor fails the f32 check
# below the same way (measured: 101 of 158 parameters off after 5 SGD
# steps). In f64 the rounding is 1e-16 and no mask flips, so kiln's training
# graphs are checked against eager's to the tolerances below (measured: 5-step
# losses equal to 1e-11, parameters to 7e-7 relative).
# resnet18 (batch 4, 64x64) is on the same edge in f32: with torch.randn
# inputs kiln's loss leaves eager's by 1.4e-3 relative at step 3 while its
# step-0 gradients are within 1.7x of eager's own f32 error everywhere, and
# whether the test's input crosses a kink depended on which BLAS call shape
# a 2x2 convolution took (one product per image or the batch in one). So it
# trains in f64 too.
_TRAIN_F64 = {"mobilenet_v2", "resnet18"}


def _train_like_eager(model, args, opt_name="sgd", steps=3, p_atol=1e-5):
    """Trains model compiled with kiln, a copy eagerly and an f64 copy
    eagerly, and checks kiln's losses and parameters against both (_close);
    returns the eager and the f64 copies."""
    ref = copy.deepcopy(model)
    exact = copy.deepcopy(model).double()
    eager = _train(ref, args, opt_name, steps, compiled=False)
    want = _train(exact, _f64(args), opt_name, steps, compiled=False)
    ours = _train(model, args, opt_name, steps, compiled=True)
    _close(ours, eager, want, 1e-4, 1e-6, "losses")
    for (pn, p), q, r in zip(model.named_parameters(), ref.parameters(), exact.parameters()):
        _close(p, q, r, 1e-4, p_atol, pn)
    return ref, exact


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("name", list(MODELS))
def test_five_training_steps_match_eager(name, opt_name):
    import kiln.backend as kb
    kb.reset()
    model, args = MODELS[name]()
    if name in _TRAIN_F64:
        model, args = model.double(), _f64(args)
    # AdamW turns a gradient that is zero up to rounding into a +-lr step
    # whose sign is the rounding's: such an element may end anywhere within
    # steps * lr of the exact one, in eager as in kiln
    p_atol = 1e-5 if opt_name == "sgd" else 5 * 1e-3
    ref, exact = _train_like_eager(model, args, opt_name, 5, p_atol)
    for (bn, b), c, r in zip(model.named_buffers(), ref.buffers(), exact.buffers()):
        if b.is_floating_point():
            # the running statistics follow the activations, which AdamW's
            # noise-driven +-lr steps shift: checked loosely for AdamW
            _close(b, c, r, 1e-4, 1e-5 if opt_name == "sgd" else 0.05, bn)
    _no_fallback()
    # every step of the training graphs is a kernel (ConvNeXt's backward
    # had its head's as_strided_scatter and copy as torch steps)
    steps = sorted({op for r in kb.records() for op in (r.get("fallback_ops") or [])})
    assert not steps, steps


class _GPT2Cached(nn.Module):
    """GPT-2 called as a training script calls it: use_cache left on, so
    transformers makes a DynamicCache whose torch.tensor([]) is a constant
    tensor in the forward graph (kiln.export: an aten.full)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids):
        return self.inner(input_ids=ids, labels=ids).loss


def test_gpt2_with_its_cache_on_trains_in_kiln():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    inner = GPT2LMHeadModel(cfg)
    inner.loss_type = "ForCausalLM"
    model, args = _GPT2Cached(inner), (_ids(6, (2, 16), 512),)
    ref = copy.deepcopy(model)
    exact = copy.deepcopy(model).double()
    eager = _train(ref, args, "sgd", 5, compiled=False)
    want = _train(exact, args, "sgd", 5, compiled=False)
    ours = _train(model, args, "sgd", 5, compiled=True)
    _close(ours, eager, want, 1e-4, 1e-6, "losses")
    for (pn, p), q, r in zip(model.named_parameters(), ref.parameters(), exact.parameters()):
        _close(p, q, r, 1e-4, 1e-5, pn)
    _no_fallback()


# ---- dropout: kiln's counter-based generator (kiln/ops.py, compiler/rng.h) ----

def test_training_dropout_runs_in_kiln_and_follows_manual_seed():
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 256), nn.Dropout(0.3), nn.Linear(256, 4), nn.Dropout(0.1))
    m.train()
    x = _x(3, 64, 16)
    cm = torch.compile(m, backend="kiln")
    torch.manual_seed(7)
    y1 = cm(x)
    torch.manual_seed(7)
    y2 = cm(x)
    torch.manual_seed(8)
    y3 = cm(x)
    assert torch.equal(y1, y2), "the same torch.manual_seed must draw the same masks"
    assert not torch.equal(y1, y3), "another seed must draw other masks"
    fw = [r for r in kb.records() if r["kind"] == "forward"]
    assert fw, kb.records()
    for r in fw:  # both dropouts ran as kernels, not as torch fallback steps
        assert not r["fallback_ops"], r
    _no_fallback()


class _UpNet(nn.Module):
    """A decoder's step: convolution, nearest 2x upsampling, convolution."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.b(nn.functional.interpolate(self.a(x), scale_factor=2, mode="nearest"))


def test_nearest_upsampling_runs_in_kiln_and_trains_like_eager(monkeypatch):
    # the forward's _unsafe_index (from the rows' and columns' float
    # arithmetic on arange) is kernels, not a torch step; the backward's
    # accumulating _unsafe_index_put, at 20² -> 40² too large a scatter for
    # a dense reduction (kiln's scatter kernel takes embedding gradients
    # only), is a torch step that
    # the runtime runs as index_adds
    import kiln.backend as kb
    import kiln.runtime as rt
    took = []
    sep = rt._index_put_separable

    def spy(*a):
        r = sep(*a)
        took.append(r is not None)
        return r
    monkeypatch.setattr(rt, "_index_put_separable", spy)
    kb.reset()
    torch.manual_seed(0)
    model = _UpNet()
    args = (_x(11, 2, 3, 20, 20),)
    _train_like_eager(model, args)
    fw = [r for r in kb.records() if r["kind"] == "forward"]
    bw = [r for r in kb.records() if r["kind"] == "backward"]
    assert fw and bw, kb.records()
    for r in fw:
        assert not r["fallback_ops"], r
    assert took and all(took), took
    _no_fallback()


class _EmbedNet(nn.Module):
    """A language model's ends: an embedding of 8192 rows with a padding
    row, a table of 4096 rows indexed directly (its gradient an
    accumulating index_put), and a head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8192, 64, padding_idx=3)
        self.table = nn.Parameter(torch.randn(4096, 64) * 0.1)
        self.head = nn.Linear(64, 10)

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids) + self.table[ids % 4096])).mean(1)


def test_a_large_embedding_gradient_is_a_scatter_kernel_and_trains_like_eager():
    # 8192 rows x 2·96 tokens x 64 columns is 100M (row, token) pairs, too
    # many for the dense reduction: the backward's embedding_dense_backward
    # and the table's index_put are kiln's scatter-add kernels, not torch
    # steps; repeated ids and the padding row among them
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    ids = _ids(12, (2, 96), 8192)
    ids[0, :8] = 3
    ids[1, 10:20] = ids[0, 30]
    _train_like_eager(_EmbedNet(), (ids,))
    bw = [r for r in kb.records() if r["kind"] == "backward"]
    assert bw, kb.records()
    for r in kb.records():
        assert not r["fallback_ops"], r
    _no_fallback()


class _GatherLossNet(nn.Module):
    """A loss over a large vocabulary built from a gather and a one-hot
    scatter (an RL policy gradient's log-probs of the chosen actions, a
    label-smoothed target)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(32, 8000)

    def forward(self, x, y):
        lp = torch.log_softmax(self.head(x), -1)
        picked = lp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        onehot = torch.zeros_like(lp).scatter_(-1, y.unsqueeze(-1), 0.9) + 0.1 / 8000
        return -(picked + (lp * onehot).sum(-1)).mean()


def test_a_large_gather_and_one_hot_scatter_are_scatter_kernels_and_train_like_eager():
    # [2, 320] tokens x 8000 classes is 5.1M (output, source) pairs, too
    # many for the dense reduction: the gather's gradient (a scatter_add
    # with an index per element) and the one-hot scatter of a value are
    # kiln's scatter kernels, not torch steps
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    y = _ids(14, (2, 320), 8000)
    y[0, :10] = 7
    _train_like_eager(_GatherLossNet(), (_x(15, 2, 320, 32), y))
    assert [r for r in kb.records() if r["kind"] == "backward"], kb.records()
    for r in kb.records():
        assert not r["fallback_ops"], r
    _no_fallback()


class _MaxAggregationNet(nn.Module):
    """A graph network layer that takes each node's max over its incoming
    messages (PyG's `scatter(..., reduce="max")`: scatter_reduce amax
    without self) and their mean."""

    def __init__(self):
        super().__init__()
        self.msg = nn.Linear(64, 64)
        self.out = nn.Linear(128, 16)

    def forward(self, x, src, dst):
        m = torch.relu(self.msg(x[src]))
        idx = dst.view(-1, 1).expand(-1, 64)
        mx = torch.zeros_like(x).scatter_reduce(0, idx, m, "amax", include_self=False)
        mean = torch.zeros_like(x).scatter_reduce(0, idx, m, "mean", include_self=False)
        return self.out(torch.cat([mx, mean], -1))


def test_a_graph_networks_max_aggregation_is_scatter_kernels_and_trains_like_eager():
    # 2048 nodes x 600 edges x 64 features is 79M (output, source) pairs:
    # scatter_reduce's amax and mean are kiln's scatter kernels (with a
    # count beside them), and so is the backward's scatter_add
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    src, dst = _ids(16, (600,), 2048), _ids(17, (600,), 2048)
    dst[:20] = 5  # a node with many messages; most nodes have none
    _train_like_eager(_MaxAggregationNet(), (_x(18, 2048, 64), src, dst))
    assert [r for r in kb.records() if r["kind"] == "backward"], kb.records()
    for r in kb.records():
        assert not r["fallback_ops"], r
    _no_fallback()


class _NewOpsNet(nn.Module):
    """ConvNeXt-V2's global response norm (linalg_vector_norm, addcmul),
    Swin's shifted-window mask built by slice assignments (slice_scatter,
    fill.Tensor), a causal triu and a lerp."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.gamma = nn.Parameter(torch.randn(8) * 0.1)
        self.beta = nn.Parameter(torch.randn(8) * 0.1)

    def forward(self, x):  # [2, 6, 6, 8]
        gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        y = torch.addcmul(self.beta + x, self.gamma, x * nx)
        mask = x.new_zeros(6, 6)
        cnt = 0
        for h in (slice(0, -3), slice(-3, None)):
            for w in (slice(0, -2), slice(-2, None)):
                mask[h, w] = cnt
                cnt += 1
        y = y + (mask + torch.triu(torch.ones_like(mask), 1))[None, :, :, None]
        return self.lin(torch.lerp(y, x, 0.3))


def test_norms_slice_assignments_triu_and_lerp_compile_without_torch_steps():
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    _train_like_eager(_NewOpsNet(), (_x(19, 2, 6, 6, 8),))
    ops = [o for r in kb.records() for o in r["fallback_ops"]]
    assert not ops, ops
    _no_fallback()


class _ActsNet(nn.Module):
    """Every activation ops_act.c lowers, each after a linear layer:
    softplus (past its threshold too), mish, leaky_relu, elu, selu, celu,
    logsigmoid, glu, prelu (per channel), softsign (sgn in its backward)
    and threshold."""

    def __init__(self):
        super().__init__()
        acts = [nn.Softplus(beta=2.0, threshold=3.0), nn.Mish(), nn.LeakyReLU(0.2), nn.ELU(),
                nn.SELU(), nn.CELU(0.5), nn.LogSigmoid(), nn.Softsign(), nn.Threshold(0.1, -1.0)]
        self.lins = nn.ModuleList([nn.Linear(16, 16) for _ in acts])
        self.acts = nn.ModuleList(acts)
        self.pre = nn.Linear(16, 32)
        self.prelu = nn.PReLU(16)

    def forward(self, x):
        for lin, act in zip(self.lins, self.acts):
            x = act(lin(x) * 3)
        return self.prelu(nn.functional.glu(self.pre(x), -1))


def test_activations_and_their_backward_compile_without_torch_steps():
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    _train_like_eager(_ActsNet(), (_x(23, 8, 16),))
    ops = [o for r in kb.records() for o in r["fallback_ops"]]
    assert not ops, ops
    _no_fallback()


class _Vol3dNet(nn.Module):
    """A volumetric U-Net level in small (nnU-Net's shape): a 3x3x3
    convolution, a stride-2 one down, a 2x2x2 stride-2 transposed one up,
    the skip concatenated, and a 1x1x1 head."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv3d(2, 6, 3, padding=1)
        self.down = nn.Conv3d(6, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose3d(8, 6, 2, stride=2)
        self.head = nn.Conv3d(12, 3, 1)

    def forward(self, x):
        e = torch.relu(self.enc(x))
        u = self.up(torch.relu(self.down(e)))
        return self.head(torch.cat([u, e], 1))


def test_3d_and_transposed_3d_convolutions_train_without_torch_steps():
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    _train_like_eager(_Vol3dNet(), (_x(31, 2, 2, 4, 6, 6),))
    ops = [o for r in kb.records() for o in r["fallback_ops"]]
    assert not ops, ops
    _no_fallback()


class _WeightNormNet(nn.Module):
    """wav2vec2's positional convolution in small (weight norm over the
    kernel's last dim, dim=2) and a weight-normed linear (dim=0)."""

    def __init__(self):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.conv = wn(nn.Conv1d(8, 8, 5, padding=2, groups=2), name="weight", dim=2)
        self.lin = wn(nn.Linear(8, 6))

    def forward(self, x):
        return self.lin(nn.functional.gelu(self.conv(x)).transpose(1, 2))


def test_weight_norm_runs_in_kiln_and_trains_like_eager():
    # _weight_norm_interface and its backward are kernels, not torch steps
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    _train_like_eager(_WeightNormNet(), (_x(13, 2, 8, 12),))
    ops = [o for r in kb.records() for o in r["fallback_ops"]]
    assert not ops, ops
    _no_fallback()


class _CombineNet(nn.Module):
    """A mixture of experts' combine in small: each half of 256 tokens (a
    fixed routing, as a buffer) goes through its expert, and index_add
    sums the experts' outputs back per token."""

    def __init__(self):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(160, 160) for _ in range(2)])
        g = torch.Generator().manual_seed(5)
        self.register_buffer("route", torch.randperm(256, generator=g))

    def forward(self, x):
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            rows = self.route[e * 128:(e + 1) * 128]
            out = out.index_add(0, rows, expert(x[rows]), alpha=0.5)
        return torch.tanh(out)


def test_index_add_of_rows_is_a_scatter_kernel_and_trains_like_eager():
    # 256 rows x 128 tokens x 160 columns per index_add is 5.2M pairs,
    # past the dense reduction's 2^22: kiln's scatter-add kernel onto self
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    _train_like_eager(_CombineNet(), (_x(14, 256, 160),))
    ops = [o for r in kb.records() for o in r["fallback_ops"]]
    assert not ops, ops
    _no_fallback()


class _BiasNet(nn.Module):
    """LeViT's attention biases in small: a [heads, positions] table read
    at a fixed [N, N] index along dim 1 and added to the scores."""

    def __init__(self):
        super().__init__()
        self.biases = nn.Parameter(torch.randn(4, 400) * 0.1)
        g = torch.Generator().manual_seed(6)
        self.register_buffer("idxs", torch.randint(0, 400, (60, 60), generator=g))

    def forward(self, scores):
        return torch.softmax(scores + self.biases[:, self.idxs], -1).mean(-1)


def test_a_bias_table_indexed_along_dim_1_trains_through_a_scatter_kernel():
    # its gradient, index_put along dim 1 (4 x 400 x 3600 pairs, past the
    # dense reduction's 2^22), is kiln's scatter-add kernel, head by head
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    _train_like_eager(_BiasNet(), (_x(15, 2, 4, 60, 60),))
    ops = [o for r in kb.records() for o in r["fallback_ops"]]
    assert not ops, ops
    _no_fallback()


class _GroupNet(nn.Module):
    """RegNet's and ConvMixer's convolutions in small: a 3x3 in 2 groups of
    16 channels (a product per group), a 7x7 depthwise over 9² (rows of
    an odd number of columns: channels-last), a 1x1, a pooled head."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(32, 32, 3, padding=1, groups=2)
        self.dw = nn.Conv2d(32, 32, 7, padding=3, groups=32)
        self.pw = nn.Conv2d(32, 16, 1)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = self.pw(nn.functional.gelu(self.dw(torch.relu(self.a(x)))))
        return self.head(h.mean((2, 3)))


class _BlockNet(nn.Module):
    """ConvMixer's depthwise convolution over enough channels that its sums
    take them in blocks (7x7 over 192 channels: ops_conv.c dw_cl_sum), with
    its backward from an NCHW grad_output, and a stride-2 grouped 3x3 over
    an even input, whose grad_input's col2im goes by phases
    (col2im_phases)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(16, 192, 1)
        self.dw = nn.Conv2d(192, 192, 7, padding=3, groups=192)
        self.s2 = nn.Conv2d(192, 64, 3, stride=2, padding=1, groups=4)
        self.head = nn.Linear(64, 5)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = self.s2(nn.functional.gelu(self.dw(h)) + h)
        return self.head(h.mean((2, 3)))


@pytest.mark.parametrize("net,shape", [(_GroupNet, (4, 32, 9, 9)), (_BlockNet, (2, 16, 10, 10))],
                         ids=["groups", "blocks"])
def test_grouped_and_depthwise_convolutions_train_like_eager(net, shape):
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    model = net()
    args = (_x(12, *shape),)
    _train_like_eager(model, args)
    recs = [r for r in kb.records() if r["kind"] in ("forward", "backward")]
    assert {r["kind"] for r in recs} == {"forward", "backward"}, kb.records()
    for r in recs:  # every convolution and its gradients ran as kernels
        assert not r["fallback_ops"], r
    _no_fallback()


def test_accumulating_index_put_as_index_adds_matches_torch():
    from kiln.runtime import _index_put_separable as sep
    A = torch.ops.aten
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 4, 5, generator=g)
    v = torch.randn(2, 3, 8, 10, generator=g)
    ih, iw = (torch.arange(8) // 2).view(8, 1), torch.arange(10) // 2
    want = A._unsafe_index_put.default(x, [None, None, ih, iw], v, True)
    torch.testing.assert_close(sep(x, [None, None, ih, iw], v, True), want)
    x2 = torch.randn(4, 5, generator=g)
    i = torch.tensor([0, 3, 3, 1, 0, 2])  # repeated indices add up
    for v2 in (torch.randn(6, 5, generator=g), torch.randn(5, generator=g)):
        torch.testing.assert_close(sep(x2, [i], v2, True), A.index_put.default(x2, [i], v2, True))
    # not one index_add per dim: the op runs as it is
    assert sep(x2, [i], torch.randn(6, 5), False) is None  # no accumulate
    assert sep(x2, [i, i.clamp(max=4)], torch.randn(6), True) is None  # pairs
    assert sep(x2, [torch.tensor([-1, 0])], torch.randn(2, 5), True) is None  # negative
    x3 = torch.randn(3, 4, 5)
    assert sep(x3, [torch.tensor([0, 1]), None, torch.tensor([1, 2])],
               torch.randn(2, 4), True) is None  # not adjacent
    assert sep(torch.zeros(4, dtype=torch.bool), [i.clamp(max=3)],
               torch.ones(6, dtype=torch.bool), True) is None


def test_dropout_draws_the_reference_bits_and_its_backward_uses_the_mask():
    p = 0.25
    d = nn.Dropout(p)
    d.train()
    x = (_x(4, 200, 500) + 3).requires_grad_()  # no zeros
    cd = torch.compile(d, backend="kiln")
    torch.manual_seed(11)
    seed = torch.empty((), dtype=torch.int64).random_()  # what the runner draws
    want, mask = torch.ops.kiln.dropout(x.detach(), p, seed, 0)
    torch.manual_seed(11)
    y = cd(x)
    assert torch.equal(y, want)
    assert torch.equal(y != 0, mask)
    kept = mask.double().mean().item()
    assert abs(kept - (1 - p)) < 0.01, kept  # 100k draws: sigma 0.0014
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, mask.to(x.dtype) * (1.0 / (1 - p)))
    _no_fallback()


def test_stochastic_depth_draws_in_the_kernels_and_its_backward_uses_the_mask():
    """torchvision's StochasticDepth and timm's DropPath draw
    ``x.new_empty(shape).bernoulli_(keep)``: aten.bernoulli.p, which the
    backend rewrites into kiln.dropout's mask of ones (drop probability
    1 - keep) drawn in the kernels from the seed input, not a fallback step
    run by torch. Rows are kept with probability keep and scaled by 1/keep,
    the seed comes from torch's generator (manual_seed repeats a draw), and
    the backward uses the forward's mask."""
    import kiln.backend as kb
    import torchvision
    from timm.layers import DropPath
    kb.reset()
    for i, (drop, keep) in enumerate(((torchvision.ops.StochasticDepth(0.3, "row"), 0.7),
                                      (DropPath(0.25), 0.75))):
        torch.manual_seed(i)
        m = nn.Sequential(nn.Linear(32, 32), drop).train()
        x = _x(5 + i, 20000, 32)
        cm = torch.compile(m, backend="kiln")
        torch.manual_seed(7)
        y = cm(x)
        torch.manual_seed(7)
        assert torch.equal(cm(x).detach(), y.detach())
        torch.manual_seed(8)
        assert not torch.equal(cm(x).detach(), y.detach())
        lin = m[0](x).detach()
        kept = y.detach().abs().sum(1) != 0
        frac = kept.double().mean().item()
        assert abs(frac - keep) < 0.02, frac  # 20000 rows: sigma 0.003
        torch.testing.assert_close(y.detach()[kept], lin[kept] / keep)
        assert torch.equal(y.detach()[~kept], torch.zeros_like(lin[~kept]))
        m.zero_grad()
        y.sum().backward()
        want = torch.full((32,), kept.sum().item() / keep)
        torch.testing.assert_close(m[0].bias.grad, want, rtol=1e-4, atol=0.0)
    recs = kb.records()
    assert {r["kind"] for r in recs} == {"forward", "backward"}, recs
    for r in recs:
        assert not r["fallback_ops"], r
    _no_fallback()


def test_training_at_changing_sequence_lengths_matches_eager():
    """dynamic=True training of a transformer layer: one symbolic forward and
    backward serve every sequence length. The forward's saved q, k, v and
    attention output are views of the buffers it computes them into, at
    symbolic sizes (lower.c output_view_bases, ops_view.c
    view_strides); the loss and every gradient match eager at each
    length."""
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0.0,
                                       batch_first=True).train()
    ref = copy.deepcopy(layer)
    cm = torch.compile(layer, backend="kiln", dynamic=True)
    for n in (8, 13, 21):
        x = _x(n, 2, n, 32)
        y = cm(x)
        loss = (y * y).mean()
        loss.backward()
        y_ref = ref(x)
        loss_ref = (y_ref * y_ref).mean()
        loss_ref.backward()
        torch.testing.assert_close(loss, loss_ref, rtol=1e-4, atol=1e-6)
        for (name, p), p_ref in zip(layer.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-5,
                                       msg=lambda m, name=name, n=n: f"length {n}, {name}: {m}")
            p.grad = None
            p_ref.grad = None
    kinds = sorted(r["kind"] for r in kb.records())
    assert kinds == ["backward", "forward"], kb.records()
    _no_fallback()


def test_dropout_under_dynamic_shapes_is_not_a_fallback():
    """dynamic=True: Dynamo re-traces a graph whose float argument (dropout's
    p) it must specialize (TensorifyScalarRestartAnalysis, raised through the
    backend); kiln lets that restart through instead of falling back, then
    compiles the graph once for every batch size."""
    import kiln.backend as kb
    kb.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 64), nn.Dropout(0.4), nn.Linear(64, 4))
    m.train()
    cm = torch.compile(m, backend="kiln", dynamic=True)
    for b in (8, 13, 21):
        x = _x(b, b, 16).requires_grad_()
        torch.manual_seed(3)
        y = cm(x)
        y.sum().backward()
        torch.manual_seed(3)
        assert torch.equal(cm(x), y)
        assert x.grad.shape == x.shape
    kinds = sorted(r["kind"] for r in kb.records())
    assert kinds == ["backward", "forward"], kb.records()
    _no_fallback()
