"""An FP8 reference for the tests, written from docs/weights.md's formulas
in numpy and sharing no code with the library: the 127 finite E4M3
magnitudes decoded from the format, the block formula (amax of the finite
values, s = max(amax, 1e-4) / 448 in f32, p = x * (1 / s) in f32), each
product rounded to the nearest finite magnitude (ties to the even code),
beyond 448 (infinities too) saturating, NaN 0x7f, the sign kept."""

import numpy as np


def e4m3_table():
    """The 127 finite E4M3 magnitudes, by code (decoded here, from the format)."""
    codes = np.arange(0x7f)
    e, m = (codes >> 3) & 15, codes & 7
    return np.where(e == 0, m * 2.0 ** -9, (8 + m) * 2.0 ** (e - 10))


def ref_fp8_blocks(x, block):
    """(codes uint8, scales f32) of a 2-D float32 array in ``block`` blocks
    (the last row and column of blocks may be partial)."""
    table = e4m3_table()
    rows, cols = x.shape
    nbr, nbc = -(-rows // block[0]), -(-cols // block[1])
    scales = np.zeros((nbr, nbc), np.float32)
    q = np.zeros(x.shape, np.uint8)
    for i in range(nbr):
        for j in range(nbc):
            b = x[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            a = np.abs(b[np.isfinite(b)])
            amax = np.float32(a.max()) if a.size else np.float32(0)
            s = np.float32(max(amax, np.float32(1e-4))) / np.float32(448)
            with np.errstate(invalid="ignore"):
                p = (b * (np.float32(1) / s)).astype(np.float32)
                mag = np.minimum(np.abs(p.astype(np.float64)), 448.0)
                hi = np.clip(np.searchsorted(table, mag), 1, 0x7e)
                lo = hi - 1
                dlo, dhi = mag - table[lo], table[hi] - mag
                code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
                code = np.where(mag >= table[0x7e], 0x7e, code)
            code = code | np.where(np.signbit(p), 0x80, 0)
            code = np.where(np.isnan(p), np.where(np.signbit(p), 0xff, 0x7f), code)
            scales[i, j] = s
            q[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = code
    return q, scales


def dequant(codes, scales, block):
    """q * s in f32 of codes and their block scales (the codes' box starts
    on a block boundary): each code's value from the table, NaN for 0x7f."""
    table = np.concatenate([e4m3_table(), [np.nan]])
    val = (np.where(codes & 0x80, -1.0, 1.0) * table[codes & 0x7f]).astype(np.float32)
    s = np.repeat(np.repeat(scales, block[0], axis=0), block[1], axis=1)[:codes.shape[0], :codes.shape[1]]
    return val * s
