"""Tensors everywhere (docs/python.md, "Tensors in and out"): every call
that reads or writes memory takes numpy arrays, buffers, torch tensors (every
dtype ferry knows, bf16 included; nn.Parameter and tensors that require
grad) and DLPack objects; destinations are written in place; results are
torch tensors of the right dtype when asked; bad memory is refused, naming
the tensor, before anything moves. Runs against one master and one node."""

import os
import secrets
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

os.environ.setdefault("FERRY_TOKEN", secrets.token_hex(32))   # the engines of the exec test

import ferry  # noqa: E402
import ferry.torch as ft  # noqa: E402
from conftest import cluster_fixture  # noqa: E402
from ferry import reshard  # noqa: E402

cluster = cluster_fixture(1, "tensors")

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool]


def sample(dtype, shape=(3, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


class DLPackOnly:
    """Memory that speaks only DLPack (no buffer protocol, not a tensor)."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


class FakeCuda:
    """An object whose DLPack device is cuda:0 (no GPU needed to test the
    refusal; __dlpack__ must never be called)."""

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None):
        raise AssertionError("exported although it is device memory")


def test_import_ferry_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, ferry; print('torch' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_put_from_get_into_every_dtype_in_place(store, dtype):
    src = sample(dtype)
    key = f"t/rt/{dtype}"
    assert store.put_from(key, src) == 0
    dst = torch.zeros_like(src)
    ptr = dst.data_ptr()
    assert store.get_into(key, dst) == src.numel() * src.element_size()
    assert dst.data_ptr() == ptr and torch.equal(dst, src)
    # put_tensor / get_tensor keep the dtype: torch.bfloat16, never uint16 words
    assert store.put_tensor(key + "/t", src) == 0
    back = store.get_tensor(key + "/t", framework="torch")
    assert back.dtype == dtype and back.shape == src.shape and torch.equal(back, src)
    assert ft.get_tensor(store, key + "/t").dtype == dtype
    # numpy unless asked: bf16 as its raw 16-bit words
    arr = store.get_tensor(key + "/t")
    assert isinstance(arr, np.ndarray)
    if dtype == torch.bfloat16:
        assert arr.dtype == np.uint16 and np.array_equal(arr, src.view(torch.int16).numpy().view(np.uint16))
    else:
        assert np.array_equal(arr, src.numpy())


def test_parameters_and_requires_grad_without_detach(store):
    p = torch.nn.Parameter(torch.arange(12, dtype=torch.float32).reshape(3, 4))
    g = torch.ones(7, dtype=torch.bfloat16, requires_grad=True)
    assert store.put_from("t/param", p) == 0 and store.put("t/grad", g) == 0
    assert store.put_tensor("t/param/t", p) == 0
    assert torch.equal(ft.get_tensor(store, "t/param/t"), p.detach())
    out = torch.nn.Parameter(torch.zeros(3, 4))          # a destination that requires grad
    ptr = out.data_ptr()
    assert store.get_into("t/param", out) == 48
    assert out.data_ptr() == ptr and torch.equal(out.detach(), p.detach())
    back = torch.empty(7, dtype=torch.bfloat16)
    store.get_into("t/grad", back)
    assert torch.equal(back, g.detach())
    store.register_buffer(p)
    try:
        assert store.put_from("t/param/reg", p) == 0
    finally:
        assert store.unregister_buffer(p) == 0


def test_dlpack_objects_and_capsules(store):
    src = sample(torch.bfloat16, (4, 4), seed=3)
    assert store.put_from("t/dl", DLPackOnly(src)) == 0
    dst = torch.zeros_like(src)
    assert store.get_into("t/dl", DLPackOnly(dst)) == 32
    assert torch.equal(dst, src)
    cap = torch.utils.dlpack.to_dlpack(torch.arange(6, dtype=torch.int32))
    assert store.put("t/cap", cap) == 0
    assert np.array_equal(np.frombuffer(store.get("t/cap"), np.int32), np.arange(6))
    assert store.put_struct("t/dl/struct", {"w": DLPackOnly(src)}) == 0
    m = store.get_members("t/dl/struct")[0]
    assert m["dtype"] == "bf16" and m["shape"] == (4, 4)
    assert torch.equal(ft.read_member(store, "t/dl/struct", "w"), src)


def test_struct_members_and_read_member_in_place(store):
    w = sample(torch.bfloat16, (6, 3), seed=4)
    ids = torch.arange(10, dtype=torch.int64)
    mask = torch.tensor([True, False, True])
    assert store.put_struct("t/st", {"w": w, "ids": ids, "mask": mask, "np": np.ones(2, np.float16)}) == 0
    dt = {m["name"]: m["dtype"] for m in store.get_members("t/st")}
    assert dt == {"w": "bf16", "ids": "i64", "mask": "bool", "np": "f16"}
    rows = store.read_member("t/st", "w", rows=(1, 4), framework="torch")
    assert rows.dtype == torch.bfloat16 and torch.equal(rows, w[1:4])
    assert torch.equal(ft.read_member(store, "t/st", "mask"), mask)
    out = torch.empty(3, 3, dtype=torch.bfloat16)
    ptr = out.data_ptr()
    assert store.read_member("t/st", "w", rows=(2, 5), out=out) is out
    assert out.data_ptr() == ptr and torch.equal(out, w[2:5])


def test_get_tensor_into_destination_and_address(store):
    src = sample(torch.float32, (4, 8), seed=5)
    store.put_tensor("t/into", src)
    dst = torch.zeros(4, 8)
    ptr = dst.data_ptr()
    got = store.get_tensor_into("t/into", dst)
    assert got is dst and dst.data_ptr() == ptr and torch.equal(dst, src)
    flat = torch.zeros(32)                      # same dtype and count: a view of the stored shape over it
    got = store.get_tensor_into("t/into", flat)
    assert got.shape == (4, 8) and got.data_ptr() == flat.data_ptr() and torch.equal(got, src)
    raw = torch.zeros(256, dtype=torch.uint8)   # raw bytes, at least the tensor's
    got = store.get_tensor_into("t/into", raw)
    assert got.dtype == torch.float32 and got.data_ptr() == raw.data_ptr() and torch.equal(got, src)
    # Mooncake's form: an address inside a registered buffer, with its size
    buf = torch.zeros(64)
    store.register_buffer(buf.data_ptr(), buf.numel() * 4)
    try:
        got = ft.get_tensor_into(store, "t/into", buf.data_ptr(), buf.numel() * 4)
        assert got.dtype == torch.float32 and got.data_ptr() == buf.data_ptr() and torch.equal(got, src)
    finally:
        store.unregister_buffer(buf.data_ptr())


def test_refused_before_anything_moves(store):
    src = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    with pytest.raises(ValueError, match=r"torch.Tensor of torch.float32, shape \[2, 2\]\) is not contiguous"):
        store.put_from("t/bad/noncontig", src[::2])
    assert not store.is_exist("t/bad/noncontig")
    with pytest.raises(ValueError, match=r"device memory \(cuda:0\) is not supported yet"):
        store.put_from("t/bad/cuda", FakeCuda())
    with pytest.raises(ValueError, match=r"device memory \(cuda:0\) is not supported yet"):
        store.get_into("t/bad/cuda", FakeCuda())
    assert not store.is_exist("t/bad/cuda")
    store.put_tensor("t/bad/f32", src)
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"get_into\('t/bad/f32'\): buffer \(numpy.ndarray of float32, shape "
                                         r"\[8\]\) is read-only"):
        store.get_into("t/bad/f32", ro)
    for bad, why in ((torch.zeros(8, dtype=torch.int32), "has dtype i32; the stored data is f32"),
                     (torch.zeros(7), "holds 28 bytes; the stored data is 32"),
                     (torch.zeros(4, dtype=torch.uint8), "holds 4 bytes; 32 are needed")):
        before = bad.clone()
        with pytest.raises(ValueError, match=why):
            store.get_tensor_into("t/bad/f32", bad)
        assert torch.equal(bad, before)                       # nothing was read into it
    with pytest.raises(ValueError, match="not contiguous"):
        store.get_into("t/bad/f32", torch.zeros(4, 4)[:, ::2])
    with pytest.raises(TypeError, match="is not memory"):
        store.put_from("t/bad/obj", object())
    with pytest.raises(ValueError, match="not inside a buffer registered"):
        store.put_from("t/bad/ptr", src.data_ptr(), 32)      # an address nobody registered
    assert not store.is_exist("t/bad/ptr")


def test_batch_and_ranges_take_tensors(store):
    srcs = [sample(torch.float16, (16,), seed=i) for i in range(3)]
    keys = [f"t/b/{i}" for i in range(3)]
    assert store.batch_put_from(keys, srcs) == [0, 0, 0]
    outs = [torch.zeros(16, dtype=torch.float16) for _ in range(3)]
    assert store.batch_get_into(keys, outs) == [32, 32, 32]
    assert all(torch.equal(a, b) for a, b in zip(outs, srcs))
    part = torch.zeros(4, dtype=torch.float16)
    assert store.get_into_ranges([(keys[1], 8, part)]) == [8]
    assert torch.equal(part, srcs[1][4:8])


def test_weights_publish_and_compat_update_as_torch(store):
    w = sample(torch.bfloat16, (4, 6), seed=7)
    b = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
    pub = ferry.WeightPublisher(store, "t-model", rank=0, world=1)
    pub.publish(1, [("w", w), ("b", b)])
    got = dict(ft.update_compat(store, "t-model"))
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], w)
    assert got["b"].dtype == torch.float32 and torch.equal(got["b"], b.detach())
    words = dict(ferry.weights.update_compat(store, "t-model"))   # numpy: bf16 as uint16 words
    assert words["w"].dtype == np.uint16
    # a parameter-direct update writes into a model's parameter in place
    dst = torch.nn.Parameter(torch.zeros(2, 6, dtype=torch.bfloat16))
    ptr = dst.data_ptr()
    ferry.weights.update_direct(store, "t-model", [("w", (2, 0), dst)])
    assert dst.data_ptr() == ptr and torch.equal(dst.detach(), w[2:4])
    f32 = ft.convert(w, "bf16", "f32")
    assert f32.dtype == torch.float32 and torch.equal(f32, w.float())
    assert ft.convert(f32, "f32", "bf16").dtype == torch.bfloat16


def test_sparse_as_torch(store):
    idx = torch.tensor([[0, 1], [2, 3]], dtype=torch.int64)
    val = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    key, _ = ferry.put_sparse_object(store, "t.sp", (4, 4), idx, val, (1, 2), ("replicate", "dp"))
    (r,), _ = ft.read_sparse_objects(store, [key], [ferry.sparse.Target("t.sp", 0, 0, (0, 0), (4, 4))])
    assert r.values.dtype == torch.bfloat16 and torch.equal(r.values, val)
    assert r.indices.dtype == torch.int64 and torch.equal(r.indices, idx)
    dense = torch.zeros(4, 4, dtype=torch.bfloat16)
    ptr = dense.data_ptr()
    assert ferry.sparse_apply(r, dense, 1) == 2
    assert dense.data_ptr() == ptr and dense[0, 1] == 1.5 and dense[2, 3] == -2.0 and dense.sum() == -0.5


def test_sample_queue_takes_and_gives_torch(store):
    with ferry.SampleQueue(store, "t-q", input_version=1) as q:
        sess = ferry.RolloutSession(session_id="s1", policy_version=1)
        q.push(sess, torch.arange(5, dtype=torch.int32), torch.full((5,), -0.5), torch.tensor([1.0]))
        (smp,) = q.pop(1, timeout_ms=10000)
        got = ft.read_sample(q, smp)
        assert got["tokens"].dtype == torch.int32 and torch.equal(got["tokens"], torch.arange(5, dtype=torch.int32))
        assert torch.equal(got["logprobs"], torch.full((5,), -0.5)) and q.ack([smp]) == [True]


def test_engine_and_reshard_bind_torch_views():
    """A reshard executed between two engines over torch tensors: the
    targets are strided views into padded torch buffers, written in place."""
    from test_exec import box, manifests
    src_man, dst_man = manifests()
    plan = reshard.Plan(src_man, dst_man)

    def carve(man, pad):
        bufs, views = {}, {}
        frags = [man.fragment(i) for i in range(man.fragment_count)]
        for r in {f["rank"] for f in frags}:
            bufs[r] = torch.full((256,), -1.0)
        used = dict.fromkeys(bufs, 0)
        for i, f in enumerate(frags):
            r, shape = f["rank"], f["shape"]
            n = shape[0] * (shape[1] + pad) if len(shape) == 2 else shape[0]
            v = bufs[r][used[r]:used[r] + n]
            views[i] = v.reshape(shape[0], shape[1] + pad)[:, :shape[1]] if len(shape) == 2 else v
            used[r] += n
        return bufs, views

    src_bufs, src_views = carve(src_man, 0)
    dst_bufs, dst_views = carve(dst_man, 1)
    for i, v in src_views.items():
        v.copy_(torch.from_numpy(box(src_man, i)))
    se, de = ferry.Engine(), ferry.Engine()
    try:
        descs = {r: de.register(b, remote=True) for r, b in dst_bufs.items()}
        src = reshard.Binding(src_man, instance=1, generation=3, lease=1)
        dst = reshard.Binding(dst_man, instance=1, generation=3, lease=2)
        for i, v in src_views.items():
            src.add(i, v, worker=src_man.fragment(i)["rank"])
        for i, v in dst_views.items():
            r = dst_man.fragment(i)["rank"]
            dst.add(i, v, worker=r, desc=descs[r])
        res = reshard.execute(plan, src, dst, engine=se, mode="sink")
        assert res["state"] == "COMPLETED"
        for i, v in dst_views.items():
            assert torch.equal(v, torch.from_numpy(box(dst_man, i))), f"target fragment {i}"
    finally:
        se.close()
        de.close()
