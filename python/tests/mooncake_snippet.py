# A Mooncake Store user's code, as they would type it against
# mooncake.store.MooncakeDistributedStore. Two lines differ (marked): the
# import, and setup(), which takes the ferry master from FERRY_MASTER and
# FERRY_TOKEN_FILE (printed by `ferry up`) instead of Mooncake's metadata
# server arguments. test_mooncake.py runs this file as it is.
import numpy as np
import torch

from ferry.torch import Store as MooncakeDistributedStore, ReplicateConfig  # differs: the import

store = MooncakeDistributedStore()
store.setup()                                                               # differs: ferry's setup

# zero-copy put and get through registered buffers, by address and size
data = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
ptr, size = data.ctypes.data, data.nbytes
rc = store.register_buffer(ptr, size)
if rc != 0:
    raise RuntimeError(f"register_buffer failed: {rc}")
config = ReplicateConfig()
config.replica_num = 1
config.with_hard_pin = True
rc = store.put_from("mc/weights", ptr, size, config)
if rc != 0:
    raise RuntimeError(f"put_from failed: {rc}")
out = np.empty_like(data)
store.register_buffer(out.ctypes.data, out.nbytes)
n = store.get_into("mc/weights", out.ctypes.data, out.nbytes)
if n != size or not np.array_equal(out, data):
    raise RuntimeError(f"get_into read {n} bytes")
print("zero-copy ok", n)

# batches by address
keys = [f"mc/batch/{i}" for i in range(4)]
chunk = size // 4
ptrs = [ptr + i * chunk for i in range(4)]
results = store.batch_put_from(keys, ptrs, [chunk] * 4)
if results != [0, 0, 0, 0]:
    raise RuntimeError(f"batch_put_from: {results}")
out[:] = 0
got = store.batch_get_into(keys, [out.ctypes.data + i * chunk for i in range(4)], [chunk] * 4)
if got != [chunk] * 4 or not np.array_equal(out, data):
    raise RuntimeError(f"batch_get_into: {got}")
print("batch ok", got)

# existence and sizes, Mooncake's integers
if store.is_exist("mc/weights") != 1 or store.is_exist("mc/none") != 0:
    raise RuntimeError("is_exist")
print("batch_is_exist", store.batch_is_exist(["mc/weights", "mc/none"]))
print("get_size", store.get_size("mc/weights"))

# upserts replace
store.put("mc/cfg", b'{"lr": 1}')
if store.upsert("mc/cfg", b'{"lr": 2}') != 0 or store.get("mc/cfg") != b'{"lr": 2}':
    raise RuntimeError("upsert")
store.put_from("mc/fresh", ptr, size)
if store.upsert_from("mc/fresh", ptr, chunk) != 0 or store.get_size("mc/fresh") != chunk:
    raise RuntimeError("upsert_from")
print("upsert ok")

# tensors: bf16 stays bf16
t = torch.randn(64, 32).to(torch.bfloat16)
if store.put_tensor("mc/tensor", t) != 0:
    raise RuntimeError("put_tensor")
back = store.get_tensor("mc/tensor")
if back.dtype != torch.bfloat16 or not torch.equal(back, t):
    raise RuntimeError(f"get_tensor: {back.dtype}")
buf = torch.empty(64 * 32, dtype=torch.bfloat16)
store.register_buffer(buf.data_ptr(), buf.numel() * buf.element_size())
view = store.get_tensor_into("mc/tensor", buf.data_ptr(), buf.numel() * buf.element_size())
if view.shape != t.shape or not torch.equal(view, t):
    raise RuntimeError("get_tensor_into")
print("tensors ok", back.dtype, tuple(view.shape))

# objects read in the last lease (5 s) stay leased to their reader, as in
# Mooncake: only the one nobody read is removed now
if store.remove("mc/fresh") != 0:
    raise RuntimeError("remove")
store.unregister_buffer(buf.data_ptr())
store.unregister_buffer(out.ctypes.data)
store.unregister_buffer(ptr)
print("close", store.close())
