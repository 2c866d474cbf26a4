"""A small GPT-style decoder in torch for the real-model tests
(test_torch_model.py, test_adapters.py): the trainer's module (separate
q/k/v/o projections with biases, a gated MLP, LayerNorms, untied lm_head,
seeded init), its functional forward over a state dict, and the rollout's
vLLM-style module: fused qkv_proj and gate_up_proj, TP-sharded, each
parameter with a ``weight_loader`` and a ``load_weights(weights)`` that
walks ``stacked_params_mapping`` the way vLLM's models do."""

import re

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

CFG = dict(vocab=64, hidden=32, heads=4, ffn=64, ctx=16, layers=2)
STACKED = [(".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
           (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1)]
TOKENS = [[3, 17, 42, 5, 9, 61, 0, 23], [11, 11, 2, 40, 33, 7, 19, 58]]


class Attention(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(h, h) for _ in range(4))


class MLP(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(h, f), nn.Linear(h, f), nn.Linear(f, h)


class Block(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(h), Attention(h), nn.LayerNorm(h), MLP(h, f)


class GPT(nn.Module):
    """The trainer's model; names are what the trainers publish."""

    def __init__(self, cfg=CFG, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        h = cfg["hidden"]
        self.cfg = cfg
        self.embed = nn.Embedding(cfg["vocab"], h)
        self.pos = nn.Embedding(cfg["ctx"], h)
        self.blocks = nn.ModuleList(Block(h, cfg["ffn"]) for _ in range(cfg["layers"]))
        self.ln_f = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, cfg["vocab"], bias=False)
        with torch.no_grad():     # LayerNorms away from 1/0, so a wrong one shows
            for n, p in self.named_parameters():
                if ".ln" in n or n.startswith("ln_f"):
                    p.add_(torch.randn_like(p) * 0.1)

    def forward(self, tokens):
        return forward({n: p for n, p in self.named_parameters()}, tokens, self.cfg)


def forward(sd, tokens, cfg=CFG):
    """Logits [batch, seq, vocab] from a state dict in the trainer's names,
    in the state dict's dtype."""
    tokens = torch.as_tensor(tokens)
    b, s = tokens.shape
    h, nh = cfg["hidden"], cfg["heads"]
    x = F.embedding(tokens, sd["embed.weight"]) + F.embedding(torch.arange(s), sd["pos.weight"])
    mask = torch.ones(s, s, dtype=torch.bool).tril()
    for i in range(cfg["layers"]):
        p = f"blocks.{i}."
        y = F.layer_norm(x, (h,), sd[p + "ln1.weight"], sd[p + "ln1.bias"])
        q, k, v = (F.linear(y, sd[p + f"attn.{t}_proj.weight"], sd[p + f"attn.{t}_proj.bias"])
                   .view(b, s, nh, h // nh).transpose(1, 2) for t in "qkv")
        a = (q @ k.transpose(-1, -2)) / (h // nh) ** 0.5
        a = torch.softmax(a.masked_fill(~mask, float("-inf")), -1) @ v
        x = x + F.linear(a.transpose(1, 2).reshape(b, s, h), sd[p + "attn.o_proj.weight"], sd[p + "attn.o_proj.bias"])
        y = F.layer_norm(x, (h,), sd[p + "ln2.weight"], sd[p + "ln2.bias"])
        g = F.gelu(F.linear(y, sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.gate_proj.bias"]))
        u = F.linear(y, sd[p + "mlp.up_proj.weight"], sd[p + "mlp.up_proj.bias"])
        x = x + F.linear(g * u, sd[p + "mlp.down_proj.weight"], sd[p + "mlp.down_proj.bias"])
    x = F.layer_norm(x, (h,), sd["ln_f.weight"], sd["ln_f.bias"])
    return F.linear(x, sd["lm_head.weight"])


def train_step(model, lr=0.05, seed=1):
    """One Adam step on a fixed batch (the same bits in every trainer process)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.cfg["vocab"], (4, 9), generator=g)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss)


# ---- trainer names -> the rollout's checkpoint names (HF style) ------------------------------

_RENAMES = [(r"^embed\.", "model.embed_tokens."), (r"^pos\.", "model.pos_embed."),
            (r"^blocks\.(\d+)\.ln1\.", r"model.layers.\1.input_layernorm."),
            (r"^blocks\.(\d+)\.ln2\.", r"model.layers.\1.post_attention_layernorm."),
            (r"^blocks\.(\d+)\.attn\.", r"model.layers.\1.self_attn."),
            (r"^blocks\.(\d+)\.mlp\.", r"model.layers.\1.mlp."), (r"^ln_f\.", "model.norm.")]


def hf_name(name):
    """The rollout checkpoint's name of a trainer tensor."""
    for pat, rep in _RENAMES:
        name, n = re.subn(pat, rep, name)
        if n:
            break
    return name


# ---- the rollout's vLLM-style model ------------------------------------------------------------

def _param(shape, dtype, kind, parts=None):
    p = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
    p.kind, p.parts = kind, parts
    return p


class VLLMGPT(nn.Module):
    """TP rank ``tp_rank`` of ``tp``: qkv_proj holds [q; k; v] of its rank,
    gate_up_proj [gate; up]; column/vocab parameters hold rows of their
    rank, row-parallel weights its columns (their biases are whole)."""

    stacked_params_mapping = STACKED

    def __init__(self, tp, tp_rank, dtype=torch.float32, cfg=CFG, fp8_block=None):
        super().__init__()
        self.tp, self.tp_rank, self.cfg = tp, tp_rank, cfg
        h, f, v = cfg["hidden"], cfg["ffn"], cfg["vocab"]
        qkv = {"q": (0, h // tp), "k": (h // tp, h // tp), "v": (2 * h // tp, h // tp)}
        gu = {0: (0, f // tp), 1: (f // tp, f // tp)}
        ps = {"model.embed_tokens.weight": _param((v // tp, h), dtype, "col"),
              "model.pos_embed.weight": _param((cfg["ctx"], h), dtype, "rep"),
              "model.norm.weight": _param((h,), dtype, "rep"), "model.norm.bias": _param((h,), dtype, "rep"),
              "lm_head.weight": _param((v // tp, h), dtype, "col")}
        for i in range(cfg["layers"]):
            p = f"model.layers.{i}."
            for ln in ("input_layernorm", "post_attention_layernorm"):
                ps[p + ln + ".weight"] = _param((h,), dtype, "rep")
                ps[p + ln + ".bias"] = _param((h,), dtype, "rep")
            ps[p + "self_attn.qkv_proj.weight"] = _param((3 * h // tp, h), dtype, "col", qkv)
            ps[p + "self_attn.qkv_proj.bias"] = _param((3 * h // tp,), dtype, "col", qkv)
            ps[p + "self_attn.o_proj.weight"] = _param((h, h // tp), dtype, "row")
            ps[p + "self_attn.o_proj.bias"] = _param((h,), dtype, "rep")
            ps[p + "mlp.gate_up_proj.weight"] = _param((2 * f // tp, h), dtype, "col", gu)
            ps[p + "mlp.gate_up_proj.bias"] = _param((2 * f // tp,), dtype, "col", gu)
            ps[p + "mlp.down_proj.weight"] = _param((h, f // tp), dtype, "row")
            ps[p + "mlp.down_proj.bias"] = _param((h,), dtype, "rep")
        if fp8_block is not None:   # an FP8 checkpoint's layout: projections as FP8 bytes + block scales
            b0, b1 = fp8_block
            for n in [n for n in ps if n.endswith("_proj.weight")]:
                rows, cols = ps[n].shape
                parts = ps[n].parts and {k: (at // b0, m // b0) for k, (at, m) in ps[n].parts.items()}
                ps[n + "_scale_inv"] = _param((-(-rows // b0), -(-cols // b1)), torch.float32, ps[n].kind, parts)
                ps[n] = _param((rows, cols), torch.uint8, ps[n].kind, ps[n].parts)
        self._names = list(ps)
        for n, p in ps.items():
            self.register_parameter(n.replace(".", "__"), p)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        for n in self._names:
            yield n, getattr(self, n.replace(".", "__"))

    def weight_loader(self, param, loaded, shard_id=None):
        """vLLM's column/row-parallel loaders: this rank's slice of the
        checkpoint tensor into its place in the parameter."""
        if param.kind == "rep":
            param.data.copy_(loaded)
            return
        if param.kind == "row":
            n = param.shape[1]
            param.data.copy_(loaded.narrow(1, self.tp_rank * n, n))
            return
        at, n = param.parts[shard_id] if shard_id is not None else (0, param.shape[0])
        param.data.narrow(0, at, n).copy_(loaded.narrow(0, self.tp_rank * n, n))

    def load_weights(self, weights):
        """vLLM's shape: ``(checkpoint name, tensor)`` pairs, q/k/v and
        gate/up stacked into their fused parameters; returns the names loaded."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            for param_name, shard_name, shard_id in self.stacked_params_mapping:
                if shard_name in name:
                    name = name.replace(shard_name, param_name)
                    self.weight_loader(params[name], w, shard_id)
                    break
            else:
                self.weight_loader(params[name], w)
            loaded.add(name)
        return loaded


def vllm_to_trainer(states, tp, cfg=CFG):
    """The trainer's full state dict from the VLLMGPT state dicts of TP
    ranks 0..tp-1 (the inverse of the sharding: rows concatenated, fused
    parts split first, row-parallel columns concatenated)."""
    h, f = cfg["hidden"], cfg["ffn"]
    inv = {hf_name(n): n for n in _trainer_names(cfg)}
    out = {}
    for name in states[0]:
        parts = [s[name] for s in states]
        if name.endswith(("qkv_proj.weight", "qkv_proj.bias")):
            for j, t in enumerate("qkv"):
                out[inv[name.replace("qkv_proj", f"{t}_proj")]] = torch.cat(
                    [p.narrow(0, j * h // tp, h // tp) for p in parts])
        elif name.endswith(("gate_up_proj.weight", "gate_up_proj.bias")):
            for j, t in enumerate(("gate", "up")):
                out[inv[name.replace("gate_up_proj", f"{t}_proj")]] = torch.cat(
                    [p.narrow(0, j * f // tp, f // tp) for p in parts])
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            out[inv[name]] = torch.cat(parts, 1)
        elif name.endswith(("embed_tokens.weight",)) or name == "lm_head.weight":
            out[inv[name]] = torch.cat(parts)
        else:
            assert all(torch.equal(parts[0], p) for p in parts[1:]), f"{name} differs between TP ranks"
            out[inv[name]] = parts[0]
    return out


def fp8_expected(sd, tp, tp_rank, quantize, cfg=CFG):
    """{name: numpy array} of the FP8 parameters of ``VLLMGPT(tp, tp_rank,
    fp8_block=...)`` — every projection's codes and ``_scale_inv`` — from
    the trainer's full state dict ``sd`` (numpy f32) through ``quantize(x)
    -> (codes, scales)`` of each whole tensor: a TP box that holds whole
    blocks holds the whole tensor's codes of its rows (columns) and the
    scale rows (columns) of their blocks; fused targets stack q, k, v and
    gate, up."""
    def rows(a):
        n = a.shape[0] // tp
        return a[tp_rank * n:(tp_rank + 1) * n]

    def cols(a):
        n = a.shape[1] // tp
        return a[:, tp_rank * n:(tp_rank + 1) * n]

    out = {}
    for i in range(cfg["layers"]):
        q = {t: quantize(sd[f"blocks.{i}.{t}.weight"]) for t in
             ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
              "mlp.down_proj")}
        p = f"model.layers.{i}."
        for name, parts, cut in (("self_attn.qkv_proj.weight", ("attn.q_proj", "attn.k_proj", "attn.v_proj"), rows),
                                 ("self_attn.o_proj.weight", ("attn.o_proj",), cols),
                                 ("mlp.gate_up_proj.weight", ("mlp.gate_proj", "mlp.up_proj"), rows),
                                 ("mlp.down_proj.weight", ("mlp.down_proj",), cols)):
            out[p + name] = np.concatenate([cut(q[t][0]) for t in parts])
            out[p + name + "_scale_inv"] = np.concatenate([cut(q[t][1]) for t in parts])
    return out


def _trainer_names(cfg=CFG):
    names = ["embed.weight", "pos.weight"]
    for i in range(cfg["layers"]):
        p = f"blocks.{i}."
        names += [p + "ln1.weight", p + "ln1.bias"]
        names += [p + f"attn.{t}_proj.{w}" for t in "qkvo" for w in ("weight", "bias")]
        names += [p + "ln2.weight", p + "ln2.bias"]
        names += [p + f"mlp.{t}_proj.{w}" for t in ("gate", "up", "down") for w in ("weight", "bias")]
    return names + ["ln_f.weight", "ln_f.bias", "lm_head.weight"]


def bits(t):
    """(dtype, shape, raw bytes) of a tensor: what 'exactly equal' compares."""
    t = t.detach().contiguous()
    raw = t.view(torch.int16 if t.element_size() == 2 else torch.int32).numpy().tobytes()
    return str(t.dtype), tuple(t.shape), raw
