"""ferry.reshard from Python: presets, layouts, manifests, JSON, errors,
plans executed on real numpy data, the plan cache and lifetimes."""

import gc
import itertools
import random

import numpy as np
import pytest

import ferry
from ferry import reshard


def test_presets_and_layouts():
    assert reshard.presets() == ["qwen3-8b", "qwen3-30b-a3b", "deepseek-v3", "kimi-k2"]
    m = reshard.preset("qwen3-30b-a3b")
    assert m.name == "qwen3-30b-a3b"
    assert m.experts == 128 and m.layers == 48
    assert 30.3e9 < m.param_count < 30.7e9
    assert m.bytes == 2 * m.param_count
    tensors = m.tensors()
    assert len(tensors) == m.tensor_count == 18867
    name, dtype, shape, role, layer, expert = tensors[-1]
    assert (name, dtype, shape, role, layer, expert) == ("lm_head.weight", "bf16", (151936, 2048), "vocab", -2, -1)
    lay = reshard.parse_layout("tp:8,dp:16")
    assert lay["ranks"] == 128 and lay["tp"] == 8 and lay["text"] == "dp:16,tp:8"
    with pytest.raises(ferry.Error) as e:
        reshard.parse_layout("tp:0")
    assert e.value.code < 0 and "tp" in str(e.value)
    with pytest.raises(ferry.Error):
        reshard.preset("nope")
    man = reshard.build(m, "ep:4,tp:2", gpus_per_node=4)
    assert man.ranks == 8
    assert man.node_of(7) == 1
    assert sum(man.rank_bytes(r) for r in range(8)) > m.bytes


def small_model():
    m = reshard.Model("tiny", 2, 2)
    m.add_tensor("emb", "f32", (10, 4), "vocab", reshard.LAYER_FIRST)
    for layer in range(2):
        m.add_tensor(f"l{layer}.norm", "f32", (4,), "replicated", layer)
        m.add_tensor(f"l{layer}.q", "f32", (6, 4), "column", layer)
        m.add_tensor(f"l{layer}.o", "f32", (4, 6), "row", layer)
        for e in range(2):
            m.add_tensor(f"l{layer}.e{e}.up", "bf16", (5, 4), "column", layer, e)
    m.add_tensor("head", "f32", (10, 4), "vocab", reshard.LAYER_LAST)
    return m


def fill(manifest, data, objects=None):
    """Source buffers: one per fragment (contiguous), or the bound objects."""
    bufs = {}
    for i in range(manifest.fragment_count):
        f = manifest.fragment(i)
        name = manifest.tensor(f["tensor"])[0]
        box = tuple(slice(o, o + s) for o, s in zip(f["offset"], f["shape"]))
        raw = np.ascontiguousarray(data[name][box]).view(np.uint8).ravel()
        if f["object"] is None:
            bufs[i] = raw
        else:
            obj = objects.setdefault(f["object"], bytearray())
            end = f["object_offset"] + raw.size
            if len(obj) < end:
                obj.extend(b"\0" * (end - len(obj)))
            obj[f["object_offset"]:end] = raw.tobytes()
    return bufs


def execute(plan, src_bufs, objects, dst):
    out = {}
    for i in range(dst.fragment_count):
        f = dst.fragment(i)
        itemsize = dst.tensor(f["tensor"])[2]
        out[i] = np.zeros(int(np.prod(f["shape"], dtype=np.int64)) * itemsize, dtype=np.uint8)
    written = {i: np.zeros(b.size, dtype=np.int32) for i, b in out.items()}
    for run in plan.runs():
        src = np.frombuffer(bytes(objects[run.src_object]), dtype=np.uint8) if run.src_object \
            else src_bufs[run.src_fragment]
        for idx in itertools.product(*(range(l.count) for l in run.loops)):
            so = run.src_offset + sum(i * l.src_stride for i, l in zip(idx, run.loops))
            do = run.dst_offset + sum(i * l.dst_stride for i, l in zip(idx, run.loops))
            out[run.dst_fragment][do:do + run.len] = src[so:so + run.len]
            written[run.dst_fragment][do:do + run.len] += 1
    return out, written


def check_targets(dst, data, out, written):
    for i in range(dst.fragment_count):
        f = dst.fragment(i)
        name = dst.tensor(f["tensor"])[0]
        box = tuple(slice(o, o + s) for o, s in zip(f["offset"], f["shape"]))
        want = np.ascontiguousarray(data[name][box]).view(np.uint8).ravel()
        assert (written[i] == 1).all(), f"fragment {i} of {name}: bytes written {set(written[i].tolist())}"
        assert np.array_equal(out[i], want), f"fragment {i} of {name}"


def model_data(model, seed):
    rng = np.random.default_rng(seed)
    data = {}
    for name, dtype, shape, *_ in model.tensors():
        npd = np.float32 if dtype == "f32" else np.uint16
        data[name] = rng.integers(0, 60000, size=shape).astype(npd)
    return data


@pytest.mark.parametrize("src_layout,dst_layout", [
    ("fsdp:3", "tp:2,dp:2"), ("ep:2,tp:2", "fsdp:5"), ("pp:2,tp:3", "ep:2"), ("tp:4", "pp:2,dp:2"),
    ("fsdp:2,tp:2", "replicated"), ("replicated", "fsdp:2,tp:2"),
])
def test_layouts_move_real_data(src_layout, dst_layout):
    model = small_model()
    data = model_data(model, 7)
    src, dst = reshard.build(model, src_layout), reshard.build(model, dst_layout)
    plan = reshard.Plan(src, dst)
    stats = plan.stats()
    assert stats["bytes"] == sum(dst.rank_bytes(r) for r in range(dst.ranks))
    out, written = execute(plan, fill(src, data), {}, dst)
    check_targets(dst, data, out, written)


def test_random_manifests_with_objects():
    rnd = random.Random(11)
    for case in range(40):
        src, dst = reshard.Manifest(16, gpus_per_node=4), reshard.Manifest(16, nodes=[r // 2 for r in range(16)])
        data = {}
        offset = 0   # packing position in the shared object
        for t in range(2):
            shape = tuple(rnd.randint(1, 6) for _ in range(rnd.randint(1, 3)))
            name = f"t{t}"
            src.add_tensor(name, "f32", shape)
            dst.add_tensor(name, "f32", shape)
            data[name] = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1000 * t
            # source: rows cut at random points, each either a fragment bound to
            # a shared object (packed back to back) or a split with copies
            cuts = sorted(set([0, shape[0]] + [rnd.randint(1, shape[0]) for _ in range(2)]))
            for a, b in zip(cuts, cuts[1:]):
                off, ext = (a,) + (0,) * (len(shape) - 1), (b - a,) + shape[1:]
                if rnd.random() < 0.5:
                    src.add_fragment(t, 3, off, ext, object="blob", object_offset=offset)
                    offset += 4 * int(np.prod(ext))
                else:
                    parts = [rnd.randint(1, 3) for _ in shape]
                    src.add_split(t, rank=rnd.randint(0, 3), parts=parts, rank_stride=[1] * len(shape),
                                  offset=off, shape=ext, replicas=2, replica_stride=8)
            # targets: a split over the last dim with copies, and one random box
            parts = [1] * (len(shape) - 1) + [rnd.randint(1, 4)]
            dst.add_split(t, rank=0, parts=parts, rank_stride=[0] * (len(shape) - 1) + [1], replicas=2,
                          replica_stride=5)
            lo = [rnd.randint(0, s - 1) for s in shape]
            dst.add_fragment(t, 15, lo, [rnd.randint(1, s - o) for s, o in zip(shape, lo)])
        plan = reshard.Plan(src, dst)
        objects = {}
        bufs = fill(src, data, objects)
        out, written = execute(plan, bufs, objects, dst)
        check_targets(dst, data, out, written)
        regions = list(plan.regions())
        assert len(regions) == plan.stats()["regions"]
        assert len(list(plan.runs())) == plan.stats()["runs"] <= len(regions)


def test_manifest_json_round_trip(tmp_path):
    m = reshard.Manifest(4, nodes=[0, 0, 1, 1])
    assert m.add_tensor("w", "bf16", (8, 6)) == 0
    m.add_split(0, rank=0, parts=(2, 1), rank_stride=(2, 0), replicas=2, replica_stride=1)
    assert m.add_tensor("s", "i64", ()) == 1
    m.add_fragment(1, 3, object="gen/s", object_offset=16)
    assert m.fragment_count == 5
    f = m.fragment(1)
    assert f["rank"] == 2 and f["node"] == 1 and f["offset"] == (4, 0) and f["shape"] == (4, 6)
    assert m.fragment(4)["object"] == "gen/s"
    text = m.to_json()
    again = reshard.Manifest.from_json(text)
    assert again.digest() == m.digest() and len(m.digest()) == 32
    assert again.topology_digest() == m.topology_digest()
    path = tmp_path / "m.json"
    m.save(str(path))
    assert reshard.Manifest.load(str(path)).to_json() == text
    with pytest.raises(ferry.Error) as e:
        reshard.Manifest.from_json(text.replace('"ferry.manifest"', '"other"'))
    assert "format" in str(e.value)
    with pytest.raises(ferry.Error) as e:
        reshard.Manifest.load(str(tmp_path / "missing.json"))
    assert e.value.code == -2  # FERRY_ENOENT


def test_errors_name_tensor_and_fragment():
    src, dst = reshard.Manifest(2), reshard.Manifest(2)
    for m in (src, dst):
        m.add_tensor("w", "f32", (8, 4))
    src.add_fragment(0, 0, (0, 0), (6, 4))
    dst.add_fragment(0, 1, (2, 0), (6, 4))
    with pytest.raises(ferry.Error) as e:
        reshard.Plan(src, dst)
    msg = str(e.value)
    assert "tensor 'w'" in msg and "target fragment 0 (rank 1" in msg and "not fully covered" in msg
    assert e.value.code == -22  # FERRY_EINVAL
    with pytest.raises(ferry.Error) as e:
        src.add_fragment(0, 5, (0, 0), (1, 1))
    assert "outside the topology" in str(e.value)
    plan = reshard.Plan(src, src, max_fragments=10, max_regions=0, max_overlaps=0)   # 0: default
    assert plan.stats()["regions"] == 1
    with pytest.raises(ferry.Error) as e:
        src.add_tensor("late", "f32", (1,))
    assert "frozen" in str(e.value)
    with pytest.raises(TypeError):
        reshard.Plan(src, src, max_frags=1)


def test_cache_filters_and_lifetimes():
    model = reshard.preset("qwen3-8b")
    cache = reshard.PlanCache(4)
    src, dst = reshard.build(model, "fsdp:4"), reshard.build(model, "tp:2,dp:2")
    p1, hit1 = cache.get(src, dst)
    p2, hit2 = cache.get(reshard.build(model, "fsdp:4"), reshard.build(model, "tp:2,dp:2"))
    assert (hit1, hit2) == (False, True) and len(cache) == 1
    assert p1.stats() == p2.stats()
    with pytest.raises(ferry.Error) as e:
        cache.get(src, dst, max_regions=5)
    assert "max_regions" in str(e.value)
    tensor = dst.find_tensor("model.layers.7.self_attn.o_proj.weight")
    regs = list(p1.regions(tensor=tensor, dst_rank=3))
    assert len(regs) == 4 and all(r.dst_rank == 3 and r.tensor == tensor for r in regs)
    assert sum(r.bytes for r in p1.runs(dst_rank=3)) == dst.rank_bytes(3)
    # plans and iterators keep what they need alive
    it = p1.runs(src_rank=2)
    del src, dst, cache, p2
    gc.collect()
    assert all(r.src_rank == 2 for r in it)
    assert p1.stats()["tensors"] == 399


def test_version_and_strerror():
    assert ferry.__version__.count(".") == 2
    assert "invalid" in ferry.strerror(-22).lower() or "argument" in ferry.strerror(-22).lower()


def test_fp8_layout_scales_per_worker():
    """A TP 2 rollout layout in FP8 blocks: each worker's scale rows
    (column-parallel) or columns (row-parallel) planned from a quantized
    source; a layout whose shard cuts a block is refused."""
    model = reshard.Model("q", 1)
    model.add_tensor("l.q_proj.weight", "bf16", (1024, 600), "column", 0)
    model.add_tensor("l.o_proj.weight", "bf16", (600, 1024), "row", 0)
    model.add_tensor("l.norm.weight", "bf16", (600,), "replicated", 0)
    src = reshard.build(model, "replicated").quantize()
    dst = reshard.build(model, "tp:2").quantize()
    q = dst.find_tensor("l.q_proj.weight")
    qs = dst.find_tensor("l.q_proj.weight_scale_inv")
    assert dst.tensor(q)[1:3] == ("f8e4m3", 1)
    assert dst.tensor(qs)[1:] == ("f32", 4, (8, 5))
    assert dst.tensor_quant(q) == {"role": "weight", "partner": qs, "dtype": "f8e4m3",
                                   "block": (128, 128), "scale_format": "f32"}
    assert dst.tensor_quant(qs)["role"] == "scale"
    assert dst.tensor_quant(dst.find_tensor("l.norm.weight")) is None
    plan = reshard.Plan(src, dst)
    os_ = dst.find_tensor("l.o_proj.weight_scale_inv")
    for rank in range(2):
        boxes = [(r.offset, r.shape) for r in plan.regions(tensor=qs, dst_rank=rank)]
        assert boxes == [((4 * rank, 0), (4, 5))]
        boxes = [(r.offset, r.shape) for r in plan.regions(tensor=os_, dst_rank=rank)]
        assert boxes == [((0, 4 * rank), (5, 4))]
    back = reshard.Manifest.from_json(dst.to_json())
    assert back.digest() == dst.digest()
    with pytest.raises(ferry.Error) as e:
        reshard.build(model, "tp:3").quantize()
    assert "l.q_proj.weight" in str(e.value) and "worker 0" in str(e.value)
    assert "row 342" in str(e.value) and e.value.code == -22
    with pytest.raises(ferry.Error) as e:
        reshard.Plan(reshard.build(model, "replicated"), dst)
    assert "quantized the same way" in str(e.value)
    custom = reshard.build(model, "replicated").quantize(
        exclude="*norm*,*o_proj*", scale_name="%s.scale", block=(64, 32), scale_format="ue8m0")
    s = custom.find_tensor("l.q_proj.weight.scale")
    assert custom.tensor(s)[3] == (16, 19)
    assert custom.tensor_quant(s)["scale_format"] == "ue8m0"
    assert custom.tensor_quant(custom.find_tensor("l.o_proj.weight")) is None
    with pytest.raises(ValueError):
        src.quantize(scale_format="e8m0")
