"""FP8 rollouts, exact against an independent reference (docs/weights.md,
"FP8 rollouts"): three trainer threads publish a MoE layer from FSDP 3
shards that cut FP8 blocks (q/k/v/o projections, four experts' w1 and
w2, a router gate and a norm left in f32 by the default rules; zero
blocks, blocks of values below the 1e-4 floor, NaNs and infinities either
side of a cut, every block's largest value landing on ±448); each of the
four workers of an ``ep:2,tp:2`` rollout layout (TP column and row
shards, EP experts) reads every fragment of the quantized layout with
``update_direct``, q/k/v into one fused qkv buffer and their scales into
one fused scale buffer; every FP8 byte and every scale equals, bit for
bit, a numpy quantizer of the documented formula (fp8_ref.py) over the
whole tensors, and every other tensor the trainers' f32 values.

And the issue's bad input, each refused with a sentence before anything
is stored or written: a quantized dtype asked for a 1-D or an integer
tensor, a block shape a rollout shard cuts, scales asked in a format or
buffer that cannot hold them, a rollout buffer for FP8 that is not one
byte per element. And FP8 through standby copies and an overlapped
update."""

import numpy as np
import pytest

import ferry
from conftest import cluster_fixture, run_threads
from ferry import reshard, weights
from fp8_ref import ref_fp8_blocks

cluster = cluster_fixture(1, "fp8")
TIMEOUT_MS = 120000
BLOCK = (16, 16)
QUANT = {"block": BLOCK}                 # the default rules, 16 x 16 blocks
EXPERTS = 4


def _model():
    """(name, shape, role, expert) of one MoE layer (expert -1: none)."""
    out = [("layers.0.input_layernorm.weight", (48,), "replicated", -1),
           ("layers.0.attn.q_proj.weight", (64, 48), "column", -1),
           ("layers.0.attn.k_proj.weight", (32, 48), "column", -1),
           ("layers.0.attn.v_proj.weight", (32, 48), "column", -1),
           ("layers.0.attn.o_proj.weight", (48, 64), "row", -1),
           ("layers.0.mlp.gate.weight", (EXPERTS, 48), "replicated", -1)]
    for e in range(EXPERTS):
        out += [(f"layers.0.mlp.experts.{e}.w1.weight", (32, 48), "column", e),
                (f"layers.0.mlp.experts.{e}.w2.weight", (48, 32), "row", e)]
    return out


def _layout(layout):
    m = reshard.Model("fp8x", 1, EXPERTS)
    for name, shape, role, expert in _model():
        m.add_tensor(name, "f32", list(shape), role, 0, expert)
    return reshard.build(m, layout)


def _values():
    """The trainers' f32 tensors: magnitudes over 24 binary orders by row and
    the special blocks of the docstring."""
    rng = np.random.default_rng(31)
    vals = {}
    for name, shape, _, _ in _model():
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 2:
            x *= np.exp2(rng.integers(-12, 12, size=(shape[0], 1))).astype(np.float32)
        vals[name] = x
    q = vals["layers.0.attn.q_proj.weight"]
    q[:16, :16] = 0                                   # a zero block
    q[21, 3], q[22, 4] = np.nan, -np.nan              # NaNs either side of the cut at row 22
    q[20, 20], q[23, 21] = np.inf, -np.inf            # infinities too: they saturate, the scale ignores them
    q[24, 40] = -1e6                                  # block (1, 2)'s amax in rank 1's rows: -448 exactly
    vals["layers.0.attn.o_proj.weight"][16:32, 32:48] *= np.float32(1e-9)   # below the 1e-4 floor
    vals["layers.0.mlp.experts.2.w1.weight"][16:32, :16] = -0.0             # a block of -0
    vals["layers.0.mlp.experts.3.w2.weight"][5, 5] = np.nan
    return vals


def _publish(cluster, model, gen, vals, src, quant=QUANT):
    def rank(r):
        mine = []
        for fid in range(src.fragment_count):
            f = src.fragment(fid)
            if f["rank"] == r and f["replica"] == 0:
                box = tuple(slice(o, o + n) for o, n in zip(f["offset"], f["shape"]))
                mine.append((fid, np.ascontiguousarray(vals[src.tensor(f["tensor"])[0]][box])))
        with cluster.store() as s:
            pub = ferry.WeightPublisher(s, model, r, src.ranks, timeout_ms=TIMEOUT_MS, quant=quant)
            return pub.publish_shards(gen, src, mine)
    return run_threads([lambda r=r: rank(r) for r in range(src.ranks)])


def test_fp8_moe_tp_ep_fused_qkv_exact(cluster, store):
    vals = _values()
    src = _layout("fsdp:3")
    res, err = _publish(cluster, "fp8x", 1, vals, src)
    assert not any(err), err
    ref = {n: ref_fp8_blocks(x, BLOCK) for n, x in vals.items() if x.ndim == 2 and ".gate." not in n}
    assert ref["layers.0.attn.q_proj.weight"][0][24, 40] == 0xfe          # -448
    assert ref["layers.0.attn.q_proj.weight"][0][20, 20] == 0x7e          # +inf saturated
    dst = _layout("ep:2,tp:2").quantize(**weights.quant_rules(QUANT))
    names = [dst.tensor(i)[0] for i in range(dst.tensor_count)]
    scale_of = {dst.tensor_quant(i)["partner"]: i for i in range(dst.tensor_count)
                if dst.tensor_quant(i) and dst.tensor_quant(i)["role"] == "scale"}
    picked = {names[i] for i in scale_of}
    assert picked == set(ref)                   # projections and experts; not the norm, not the router
    qkv = ("layers.0.attn.q_proj.weight", "layers.0.attn.k_proj.weight", "layers.0.attn.v_proj.weight")
    seen_experts, stored = set(), sum(st["bytes"] for st in res)
    for w in range(dst.ranks):
        frags = [dst.fragment(fid) for fid in range(dst.fragment_count) if dst.fragment(fid)["rank"] == w]
        box = {names[f["tensor"]]: (tuple(f["offset"]), tuple(f["shape"])) for f in frags}
        # q, k, v and their scales into one fused buffer each, the way a fused qkv_proj holds them
        rows = [box[n][1][0] for n in qkv]
        srows = [box[names[scale_of[names.index(n)]]][1][0] for n in qkv]
        fused = np.full((sum(rows), 48), 0x33, np.uint8)
        fused_s = np.full((sum(srows), 3), -1.0, np.float32)
        shards, bufs = [], {}
        for k, n in enumerate(qkv):
            sname = names[scale_of[names.index(n)]]
            shards.append((n, box[n][0], fused[sum(rows[:k]):sum(rows[:k + 1])]))
            shards.append((sname, box[sname][0], fused_s[sum(srows[:k]):sum(srows[:k + 1])]))
        for n, (off, shp) in box.items():
            if n in qkv or any(n == names[scale_of[names.index(q)]] for q in qkv):
                continue
            i = names.index(n)
            dt = {"f8e4m3": np.uint8, "f32": np.float32}[dst.tensor(i)[1]]
            bufs[n] = np.full(shp, 0x33 if dt == np.uint8 else -1.0, dt)
            shards.append((n, off, bufs[n]))
        st = weights.update_direct(store, "fp8x", shards)
        assert st["generation"] == 1
        assert st["bytes_read"] == fused.nbytes + fused_s.nbytes + sum(b.nbytes for b in bufs.values())

        def cut(a, off, shp):
            return a[tuple(slice(o, o + n) for o, n in zip(off, shp))]

        want = np.concatenate([cut(ref[n][0], *box[n]) for n in qkv])
        assert np.array_equal(fused, want), f"worker {w}: fused qkv differs from the reference"
        want_s = np.concatenate([cut(ref[n][1], *box[names[scale_of[names.index(n)]]]) for n in qkv])
        assert np.array_equal(fused_s.view(np.uint32), want_s.view(np.uint32)), f"worker {w}: qkv scales"
        for n, b in bufs.items():
            i = names.index(n)
            q = dst.tensor_quant(i)
            if q is None:
                assert np.array_equal(b, cut(vals[n], *box[n]), equal_nan=True), (w, n)
            elif q["role"] == "weight":
                assert np.array_equal(b, cut(ref[n][0], *box[n])), f"worker {w}: {n} differs from the reference"
                if ".experts." in n:
                    seen_experts.add(int(n.split(".")[4]))
            else:
                assert np.array_equal(b.view(np.uint32), cut(ref[names[q["partner"]]][1], *box[n]).view(np.uint32)), \
                    f"worker {w}: {n} differs from the reference"
        # the EP rank holds its two experts and no other
        mine = {int(n.split(".")[4]) for n in box if ".experts." in n}
        assert mine == ({0, 1} if w < 2 else {2, 3}), (w, mine)
    assert seen_experts == set(range(EXPERTS))
    assert stored == sum(ref[n][0].nbytes + ref[n][1].nbytes for n in ref) + \
        sum(x.nbytes for n, x in vals.items() if n not in ref)              # FP8, scales, f32 rest


def _nothing_stored(store, model):
    assert weights.active(store, model) is None
    assert store.list_all(f"ferry/w/{model}/") == []


def _refused(results):
    res, err = results
    assert all(isinstance(e, ferry.Error) for e in err), (res, err)
    return str(err[0])


def test_fp8_bad_input_refused_before_anything_is_stored(cluster, store):
    vals = _values()
    src = _layout("fsdp:3")
    # a quantized dtype asked for a 1-D tensor: the norm picked by the include rule
    msg = _refused(_publish(cluster, "bad1d", 1, vals, src, quant={"include": "*weight", "exclude": ""}))
    assert "tensor 'layers.0.input_layernorm.weight' has 1 dims: FP8 blocks need a 2-D tensor" in msg, msg
    _nothing_stored(store, "bad1d")
    # ... and for an integer tensor
    m = reshard.Manifest(1)
    m.add_fragment(m.add_tensor("ids.weight", "i32", (16, 16)), 0)
    with cluster.store() as s:
        pub = ferry.WeightPublisher(s, "badint", 0, 1, timeout_ms=TIMEOUT_MS, quant=QUANT)
        with pytest.raises(ferry.Error) as e:
            pub.publish_shards(1, m, [(0, np.zeros((16, 16), np.int32))])
    assert "tensor 'ids.weight' is i32: FP8 blocks are quantized from f32, bf16 or f16" in str(e.value)
    _nothing_stored(store, "badint")
    # scales asked in a format that cannot be one
    _, err = _publish(cluster, "badfmt", 1, vals, src, quant={"scale_format": "bf16"})
    assert all(isinstance(e, ValueError) and "scale_format must be 'f32' or 'ue8m0', not 'bf16'" in str(e)
               for e in err), err
    _nothing_stored(store, "badfmt")
    # a rollout layout whose shard cuts a block: refused where it is built, naming tensor, worker, boundary
    with pytest.raises(ferry.Error) as e:
        _layout("tp:3").quantize(**weights.quant_rules(QUANT))
    assert "quantize: tensor 'layers.0.attn.q_proj.weight' (f8e4m3 in 16 x 16 blocks): the shard of worker 0" in \
        str(e.value) and "a rollout shard must hold whole blocks" in str(e.value), str(e.value)

    # a good generation, then rollout buffers that cannot hold what is stored: refused, untouched
    _, err = _publish(cluster, "fp8ok", 1, vals, src)
    assert not any(err), err
    q = "layers.0.attn.q_proj.weight"
    cases = [((q, (0, 0), np.full((32, 48), 7, np.float16)), "the shard's buffer holds 2-byte elements, an FP8 buffer"),
             ((q + "_scale_inv", (0, 0), np.full((2, 3), 7, np.float16)), "2-byte elements"),
             ((q, (8, 0), np.full((16, 48), 7, np.uint8)), "a rollout shard must hold whole blocks")]
    for shard, want in cases:
        before = shard[2].copy()
        with pytest.raises(ferry.Error) as e:
            weights.update_direct(store, "fp8ok", [shard])
        assert want in str(e.value), str(e.value)
        assert np.array_equal(shard[2], before)              # nothing written
    assert weights.active(store, "fp8ok")[0] == 1           # the stored generation stands


def _cut(a, off, shp):
    return a[tuple(slice(o, o + n) for o, n in zip(off, shp))]


def test_fp8_standby_and_overlapped_update(cluster):
    """FP8 through standby copies and the overlapped update: a TP 2 group
    with a standby copy of every shard takes generation 1 with a plain
    update, then generation 2 with ``update(next=2)`` called before the
    trainers publish it (they publish beside it); the copy each update flips
    to holds that generation's FP8 bytes and scales, bit for bit the
    reference's, and the other copy still the generation before."""
    gens = {1: _values()}
    gens[2] = {n: x * np.float32(-0.375) for n, x in gens[1].items()}
    src = _layout("fsdp:3")
    dst = _layout("tp:2").quantize(**weights.quant_rules(QUANT))
    names = [dst.tensor(i)[0] for i in range(dst.tensor_count)]
    want = {}
    for g, vals in gens.items():
        want[g] = dict(vals)
        for i in range(dst.tensor_count):
            q = dst.tensor_quant(i)
            if q and q["role"] == "weight":
                want[g][names[i]], want[g][names[q["partner"]]] = ref_fp8_blocks(vals[names[i]], BLOCK)
    _, err = _publish(cluster, "fp8sb", 1, gens[1], src)
    assert not any(err), err

    def buffers(r):
        out = []
        for fid in range(dst.fragment_count):
            f = dst.fragment(fid)
            if f["rank"] == r:
                dt = np.uint8 if dst.tensor(f["tensor"])[1] == "f8e4m3" else np.float32
                out.append((names[f["tensor"]], tuple(f["offset"]), np.zeros(f["shape"], dt)))
        return out

    def holds(arrays, shards, g):
        return all(np.array_equal(a.view(np.uint8), _cut(want[g][n], off, a.shape).view(np.uint8))
                   for (n, off, _), a in zip(shards, arrays))

    def rank(r):
        first, second = buffers(r), buffers(r)
        with cluster.store() as s:
            with ferry.WeightSubscriber(s, "fp8sb", "sb8", r, 2, first, timeout_ms=TIMEOUT_MS,
                                        standby=[a for _, _, a in second]) as sub:
                st1 = sub.update()
                copy1, g1, arrays1 = sub.active
                ok1 = g1 == 1 and holds(arrays1, first, 1)
                st2 = sub.update(next=2)
                copy2, g2, arrays2 = sub.active
                ok2 = g2 == 2 and copy2 != copy1 and holds(arrays2, first, 2) and holds(arrays1, first, 1)
                return st1["generation"], st2["generation"], ok1, ok2, st2.get("overlapped")

    def trainers():
        _, e = _publish(cluster, "fp8sb", 2, gens[2], src)
        if any(e):
            raise next(x for x in e if x)
        return "published"

    res, err = run_threads([lambda: rank(0), lambda: rank(1), trainers])
    assert not any(err), err
    for r in range(2):
        assert res[r][:4] == (1, 2, True, True), (r, res[r])
    print(f"\nFP8 standby group: overlapped {[res[r][4] for r in range(2)]}")


def test_fp8_torch_helpers_and_refusals(store):
    """ferry.torch's FP8 helpers on this torch (uint8 where it has no
    float8) and dequantize_fp8 against the reference's q * s on every code;
    an FP8 Subscriber refuses parameters that cannot hold what is stored,
    naming them, before anything is read."""
    torch = pytest.importorskip("torch")
    import ferry.torch as ft
    from fp8_ref import dequant
    e = ft.fp8_empty((4, 4))
    f8 = getattr(torch, "float8_e4m3fn", None)
    assert e.dtype == (f8 or torch.uint8) and ft.empty((4, 4), "f8e4m3").dtype == e.dtype
    u = torch.arange(256, dtype=torch.uint8).reshape(16, 16)
    assert ft.fp8_view(u).dtype == (f8 or torch.uint8) and ft.fp8_view(u).data_ptr() == u.data_ptr()
    scales = torch.tensor([[0.5, 3.0], [2.0 ** -7, 1e-4 / 448]], dtype=torch.float32)
    got = ft.dequantize_fp8(u, scales, (8, 8))
    want = dequant(u.numpy(), scales.numpy(), (8, 8))
    assert np.array_equal(got.numpy(), want, equal_nan=True)
    assert ft.dequantize_fp8(u, scales, (8, 8), torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="needs \\[2, 2\\] float32 scales"):
        ft.dequantize_fp8(u, scales[:1], (8, 8))
    tensors = [("l.q_proj.weight", (64, 48), "f32"), ("l.norm.weight", (48,), "f32")]
    good = {"l.q_proj.weight": ft.fp8_empty((32, 48)), "l.q_proj.weight_scale_inv": torch.zeros(2, 3),
            "l.norm.weight": torch.zeros(48)}
    for name, bad, says in (("l.q_proj.weight", torch.zeros(32, 48, dtype=torch.bfloat16),
                             "parameter l.q_proj.weight is torch.bfloat16; tensor l.q_proj.weight is published "
                             "as f8e4m3 (FP8: a torch.uint8 parameter, ferry.torch.fp8_empty)"),
                            ("l.q_proj.weight_scale_inv", torch.zeros(2, 3, dtype=torch.float16),
                             "tensor l.q_proj.weight_scale_inv is published as f32"),
                            ("l.q_proj.weight", ft.fp8_empty((64, 48)), "parameter l.q_proj.weight has shape")):
        mod = dict(good, **{name: bad})
        with pytest.raises(ValueError) as e:
            ft.Subscriber(store, "fp8x", mod, "tp:2", 0, tensors=tensors, quant=QUANT)
        assert says in str(e.value), str(e.value)
    with ft.Subscriber(store, "fp8x", good, "tp:2", 0, tensors=tensors, quant=QUANT) as sub:
        assert [n for n, _, _ in sub.shards] == ["l.q_proj.weight", "l.norm.weight", "l.q_proj.weight_scale_inv"]
