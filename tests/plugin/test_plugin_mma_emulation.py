"""The tensor-core kernel's warp-level data flow, emulated in NumPy from the PTX ISA's definitions (no GPU here).

ldmatrix (plain and .trans) and mma.m16n8k16 are emulated lane by lane from the PTX ISA's fragment layouts, and the
kernel's own index formulas (plugins/dflashAttention/dflashAttentionMma.cuh: the XOR swizzle, the ldmatrix lane
addresses, the score and P fragments, the online softmax, the output mapping) are transcribed as they are written
there. A wrong lane address, fragment order or swizzle in the kernel then gives a wrong attention here: the result
must match a float64 softmax attention to bf16 accuracy.
"""

from __future__ import annotations

import numpy as np
import pytest

LANES = np.arange(32)
QUAD_ROW, QUAD_COL = LANES // 4, LANES % 4  # groupID, threadID_in_group
KEY_TILE, ROWS = 64, 64


def bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.view(np.float32)


def tile_offset(row, chunk, dh):  # the kernel's tileOffset<DH>
    return row * dh + ((chunk ^ (row & 7)) << 3)


def ldmatrix_x4(smem, addresses, trans=False):
    """PTX ldmatrix .m8n8.x4 .b16: lanes 8m..8m+7 give the row addresses of matrix m; register m of lane t holds
    (row t/4, cols 2(t%4), 2(t%4)+1) of matrix m, or with .trans (rows 2(t%4), 2(t%4)+1, col t/4)."""
    regs = np.zeros((32, 4, 2), dtype=np.float32)
    for m in range(4):
        rows = np.stack([smem[addresses[8 * m + i]:addresses[8 * m + i] + 8] for i in range(8)])  # [8, 8]
        for t in range(32):
            if trans:
                regs[t, m] = rows[2 * (t % 4):2 * (t % 4) + 2, t // 4]
            else:
                regs[t, m] = rows[t // 4, 2 * (t % 4):2 * (t % 4) + 2]
    return regs


def mma_16816(acc, a, b0, b1):
    """PTX mma.m16n8k16 (row.col, fp32 accumulate) over per-lane fragments: a [32,4,2], b0/b1 [32,2], acc [32,4]."""
    A, B = np.zeros((16, 16)), np.zeros((16, 8))
    for t in range(32):
        g, c = t // 4, t % 4
        for i in range(8):  # a_i: row g + 8((i/2)%2), col 2c + i%2 + 8(i/4)
            A[g + 8 * ((i // 2) % 2), 2 * c + i % 2 + 8 * (i // 4)] = a[t, i // 2, i % 2]
        for i in range(4):  # b_i: row 2c + i%2 + 8(i/2), col g
            B[2 * c + i % 2 + 8 * (i // 2), g] = (b0 if i < 2 else b1)[t, i % 2]
    D = A @ B
    out = acc.copy()
    for t in range(32):
        g, c = t // 4, t % 4
        for i in range(4):  # c_i: row g + 8(i/2), col 2c + i%2
            out[t, i] += D[g + 8 * (i // 2), 2 * c + i % 2]
    return out


def emulate_warp(q_rows, keys, values, scale_log2, dh):
    """One warp's 16 query rows over every key (tiles of 64), as the kernel computes them; returns [16, dh]."""
    num_keys = keys.shape[0]
    tiles = -(-num_keys // KEY_TILE)
    # Q fragments: qFrag[kk][0..3] = (row0, col), (row1, col), (row0, col+8), (row1, col+8), col = 16kk + 2 quadCol.
    qfrag = np.zeros((dh // 16, 32, 4, 2), dtype=np.float32)
    for kk in range(dh // 16):
        col = kk * 16 + QUAD_COL * 2
        for j, (rows, cols) in enumerate(((QUAD_ROW, col), (QUAD_ROW + 8, col), (QUAD_ROW, col + 8),
                                          (QUAD_ROW + 8, col + 8))):
            qfrag[kk, :, j, 0], qfrag[kk, :, j, 1] = q_rows[rows, cols], q_rows[rows, cols + 1]
    acc = np.zeros((dh // 8, 32, 4))
    row_max, row_sum = np.full((32, 2), -np.inf), np.zeros((32, 2))
    matrix, matrix_row = LANES // 8, LANES % 8
    for tile in range(tiles):
        sk, sv = np.zeros(KEY_TILE * dh, np.float32), np.zeros(KEY_TILE * dh, np.float32)
        for row in range(KEY_TILE):  # cp.async chunks into the swizzled tile; zero-filled beyond the keys
            key = tile * KEY_TILE + row
            for chunk in range(dh // 8):
                o = tile_offset(row, chunk, dh)
                if key < num_keys:
                    sk[o:o + 8], sv[o:o + 8] = keys[key, chunk * 8:chunk * 8 + 8], values[key, chunk * 8:chunk * 8 + 8]
        score = np.zeros((KEY_TILE // 8, 32, 4))
        for kk in range(dh // 16):
            for j in range(0, KEY_TILE // 8, 2):
                key = (j + matrix // 2) * 8 + matrix_row
                b = ldmatrix_x4(sk, tile_offset(key, 2 * kk + matrix % 2, dh))
                score[j] = mma_16816(score[j], qfrag[kk], b[:, 0], b[:, 1])
                score[j + 1] = mma_16816(score[j + 1], qfrag[kk], b[:, 2], b[:, 3])
        tile_max = np.full((32, 2), -np.inf)
        for j in range(KEY_TILE // 8):
            for e in range(4):
                key = tile * KEY_TILE + j * 8 + QUAD_COL * 2 + (e & 1)
                score[j][:, e] = np.where(key < num_keys, score[j][:, e] * scale_log2, -np.inf)
                tile_max[:, e // 2] = np.maximum(tile_max[:, e // 2], score[j][:, e])
        for r in range(2):  # the quad's shuffles (xor 1, 2) give every lane of a quad the row's maximum
            tile_max[:, r] = tile_max[:, r].reshape(8, 4).max(axis=1).repeat(4)
        new_max = np.maximum(row_max, tile_max)
        alpha = np.exp2(row_max - new_max)
        row_max, row_sum = new_max, row_sum * alpha
        acc[:, :, 0:2] *= alpha[None, :, 0:1]
        acc[:, :, 2:4] *= alpha[None, :, 1:2]
        for step in range(KEY_TILE // 16):
            p = np.zeros((32, 4, 2), dtype=np.float32)
            for half in range(2):
                s = score[2 * step + half]
                p[:, 2 * half] = bf16(np.exp2(s[:, 0:2] - row_max[:, 0:1]))
                p[:, 2 * half + 1] = bf16(np.exp2(s[:, 2:4] - row_max[:, 1:2]))
                row_sum[:, 0] += p[:, 2 * half].sum(axis=1)
                row_sum[:, 1] += p[:, 2 * half + 1].sum(axis=1)
            key = step * 16 + (matrix % 2) * 8 + matrix_row
            for d in range(0, dh // 8, 2):
                b = ldmatrix_x4(sv, tile_offset(key, d + matrix // 2, dh), trans=True)
                acc[d] = mma_16816(acc[d], p, b[:, 0], b[:, 1])
                acc[d + 1] = mma_16816(acc[d + 1], p, b[:, 2], b[:, 3])
    row_sum = row_sum.reshape(8, 4, 2).sum(axis=1).repeat(4, axis=0)  # the quad reduction
    out = np.zeros((16, dh))
    for r in range(2):
        for d in range(dh // 8):
            for e in range(2):  # element (row quadRow + 8r, col 8d + 2 quadCol + e) = acc[d][2r + e] / sum
                out[QUAD_ROW + 8 * r, d * 8 + QUAD_COL * 2 + e] = acc[d][:, 2 * r + e] / row_sum[:, r]
    return out


@pytest.mark.parametrize("dh,num_keys", [(64, 100), (128, 130)])
def test_emulated_kernel_computes_softmax_attention(dh, num_keys):
    rng = np.random.default_rng(dh)
    q = bf16(rng.standard_normal((16, dh)))
    keys, values = bf16(rng.standard_normal((num_keys, dh))), bf16(rng.standard_normal((num_keys, dh)))
    scale = dh ** -0.5
    ours = emulate_warp(q, keys, values, scale * np.log2(np.e), dh)
    scores = q.astype(np.float64) @ keys.T.astype(np.float64) * scale
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    expected = weights @ values.astype(np.float64) / weights.sum(axis=1, keepdims=True)
    err = np.abs(ours - expected)
    assert err.max() <= 2.0 ** -8 * np.abs(expected).max(), (err.max(), np.abs(expected).max())


def test_swizzle_is_a_permutation_within_each_row():
    for dh in (64, 128):
        for row in range(KEY_TILE):
            offsets = sorted(tile_offset(row, c, dh) for c in range(dh // 8))
            assert offsets == [row * dh + 8 * c for c in range(dh // 8)]
    # the 8 rows an ldmatrix reads at one logical chunk land in 8 distinct 16-byte bank groups
    for chunk in range(8):
        assert len({(tile_offset(r, chunk, 64) // 8) % 8 for r in range(8)}) == 8
