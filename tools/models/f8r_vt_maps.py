#!/usr/bin/env python3
"""Checks F8R_VT's index maps (kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh: vt_step,
vt_frag, f8r_vt_loop's products and epilogue) without a GPU: every A-fragment element of each
m-block is assigned exactly once, its k index is its token's place in the k step, and reading
the accumulators back through the epilogue's feature map gives O = P V (values, not rounding:
the arithmetic of the conversion is e4m3x2_bits's, tested on the GPU).

wgmma layouts used (PTX ISA, m64nNk16 with A in registers): thread (warp wq, lane 4 g + qd)
holds A rows 16 wq + g (+ 8), columns 2 qd (+ 1) and 8 + 2 qd (+ 1) as a[0..3]; accumulator
d[4 i + jj] is row 16 wq + g + 8 (jj >> 1), column 8 i + 2 qd + (jj & 1).

Usage: python3 tools/models/f8r_vt_maps.py   (prints the largest difference; exits 1 if > 1e-9)
"""
import random
import sys


def main():
    rnd = random.Random(19)
    H, T, F = 64, 64, 512
    P = [[rnd.random() for _ in range(T)] for _ in range(H)]
    V = [[rnd.random() for _ in range(F)] for _ in range(T)]
    O = [[None] * F for _ in range(H)]
    threads = [(wq, g, qd) for wq in range(4) for g in range(8) for qd in range(4)]
    for w in range(2):  # warpgroups 1 and 2: scale groups 2w, 2w + 1
        o = {(t, m, i): 0.0 for t in threads for m in range(4) for i in range(32)}
        for ks in range(4):
            for j in range(2):
                G = 2 * w + j
                for e in range(2):
                    m = 2 * j + e
                    A = [[None] * 16 for _ in range(64)]
                    for wq, g, qd in threads:
                        kw = 8 * wq + g  # vt_step's code word of the group
                        for r in range(4):  # vt_frag's a[r]
                            hh, ht = r & 1, r >> 1
                            for half in range(2):  # vt_pair_bits: low half token t, high half t + 1
                                t = 16 * ks + 2 * qd + 8 * ht + half
                                row, col = 16 * wq + g + 8 * hh, 2 * qd + 8 * ht + half
                                assert A[row][col] is None, "A element assigned twice"
                                A[row][col] = (t, 128 * G + 4 * kw + 2 * e + hh)
                    for wq, g, qd in threads:  # the product: B = P^T of k step ks
                        for i in range(8):
                            for jj in range(4):
                                row, n = 16 * wq + g + 8 * (jj >> 1), 8 * i + 2 * qd + (jj & 1)
                                acc = 0.0
                                for k in range(16):
                                    t, feat = A[row][k]
                                    assert t == 16 * ks + k, "token is not the k index"
                                    acc += V[t][feat] * P[n][t]
                                o[((wq, g, qd), m, 4 * i + jj)] += acc
        for wq, g, qd in threads:  # f8r_vt_loop's epilogue
            kw = 8 * wq + g
            for i in range(8):
                for c in range(2):
                    r = 8 * i + 2 * qd + c
                    for j in range(2):
                        col = 128 * (2 * w + j) + 4 * kw
                        th = (wq, g, qd)
                        vals = [o[(th, 2 * j, 4 * i + c)], o[(th, 2 * j, 4 * i + 2 + c)],
                                o[(th, 2 * j + 1, 4 * i + c)], o[(th, 2 * j + 1, 4 * i + 2 + c)]]
                        for d in range(4):
                            assert O[r][col + d] is None, "output element written twice"
                            O[r][col + d] = vals[d]
    err = max(abs(O[h][f] - sum(P[h][t] * V[t][f] for t in range(T))) for h in range(H) for f in range(F))
    print(f"F8R_VT index maps: largest |O - P V| = {err:.3g} over {H} x {F}")
    return 0 if err <= 1e-9 else 1


if __name__ == "__main__":
    sys.exit(main())
