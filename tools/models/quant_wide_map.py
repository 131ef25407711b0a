#!/usr/bin/env python3
"""Checks QuantizeFp8's wide kernel (kernels-cuda/fp8_matmul.cu: fp8mm::quantize_wide) and its
launch (crates/vt-cuda/src/fp8_matmul.rs: plan_quantize, QuantKernel::Wide) without a GPU, by
running their index arithmetic as written over every thread of every CTA:

- every (row, 128-group) of an M x K input is quantized by exactly one half-warp, and within it
  every column by exactly one lane (a lane's 8 columns from 128 g + 8 sub, the row's tail cut at
  K); the scale of each (row, group) is written once (the half's lane 0);
- a warp whose two halves both lie past the row's groups leaves before the loop (as the kernel's
  __all_sync), the others loop while any of their lanes has a row (the kernel's __any_sync);
- the grid is what the host plans (x = ceil(groups / 2^lw), y = min(ceil(M / (16 / 2^lw x
  QUANT_ROWS)), 32 SMs' worth / x, 65535)), QUANT_ROWS read from the kernel file.

Usage: python3 tools/models/quant_wide_map.py   (exit 1 on the first failed check)
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Miss(Exception):
    pass


def fail(msg):
    raise Miss(msg)


def constants():
    src = open(os.path.join(ROOT, "kernels-cuda", "fp8_matmul.cu")).read()
    m = re.search(r"enum : int \{ QUANT_ROWS = (\d+), QUANT_LANE = (\d+), QUANT_THREADS = (\d+) \}", src)
    if not m:
        fail("fp8_matmul.cu: the QUANT_ROWS / QUANT_LANE / QUANT_THREADS enumerators moved")
    # The lines this model runs, as the kernel has them.
    for line in ("const int lane = threadIdx.x & 31, half = threadIdx.x >> 4, sub = lane & 15;",
                 "const int lw = quantize_wide_lw(groups), rows = 16 >> lw;",
                 "if (__all_sync(0xffffffffu, !col_ok)) return;",
                 "const i64 grp = ((i64)blockIdx.x << lw) + (half & ((1 << lw) - 1));",
                 "const i64 c0 = grp * 128 + QUANT_LANE * sub;",
                 "const i64 stride = (i64)gridDim.y * rows;",
                 "for (i64 r0 = (i64)blockIdx.y * rows + (half >> lw); __any_sync(0xffffffffu, r0 < m);",
                 "r0 += QUANT_ROWS * stride) {",
                 "const i64 row = r0 + j * stride;",
                 "if (sub == 0) scale[row * s0 + grp * s1] = s;",
                 "return groups >= 16 ? 4 : groups >= 8 ? 3 : groups >= 4 ? 2 : groups >= 2 ? 1 : 0;"):
        if line not in src:
            fail(f"fp8_matmul.cu no longer has `{line}`: update this model")
    rs = open(os.path.join(ROOT, "crates", "vt-cuda", "src", "fp8_matmul.rs")).read()
    for line in ("let cap = (32 * sms.max(1) as i64 / gx).clamp(1, 65535);",
                 '("quantize_fp8_wide", cdiv(m, (16 >> lw) * QUANT_ROWS).min(cap))'):
        if line not in rs:
            fail(f"fp8_matmul.rs no longer has `{line}`: update this model")
    h = re.search(r"const QUANT_ROWS: i64 = (\d+);", rs)
    if not h or int(h.group(1)) != int(m.group(1)):
        fail("fp8_matmul.rs's QUANT_ROWS differs from the kernel's")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def lw_of(groups):  # quantize_wide_lw and the host's match
    return 4 if groups >= 16 else 3 if groups >= 8 else 2 if groups >= 4 else 1 if groups >= 2 else 0


def plan(m, k, sms, rows_in_flight):
    groups = (k + 127) // 128
    lw = lw_of(groups)
    gx = -(-groups // (1 << lw))
    cap = min(max(32 * sms // gx, 1), 65535)
    gy = min(-(-m // ((16 >> lw) * rows_in_flight)), cap)
    return gx, gy


def run(m, k, sms, consts, step_rows=None):
    """step_rows: the rows a pass advances by, in strides (the kernel's QUANT_ROWS; another
    value only to show that the check catches it)."""
    R, LANE, THREADS = consts
    gx, gy = plan(m, k, sms, R)
    groups = (k + 127) // 128
    lw = lw_of(groups)
    rows = 16 >> lw
    stride = gy * rows
    cols = [[0] * k for _ in range(m)]
    scales = [[0] * groups for _ in range(m)]
    for bx in range(gx):
        for by in range(gy):
            for warp in range(THREADS // 32):
                halves = []
                for half in (2 * warp, 2 * warp + 1):
                    grp = (bx << lw) + (half & ((1 << lw) - 1))
                    halves.append((grp, by * rows + (half >> lw)))
                r0s = [r for _, r in halves]
                if all(grp >= groups for grp, _ in halves):
                    continue  # the warp leaves before the loop
                passes = 0
                while any(r < m for r in r0s):  # __any_sync over the warp
                    for (grp, _), r0 in zip(halves, r0s):
                        for j in range(R):
                            row = r0 + j * stride
                            if grp >= groups or row >= m:
                                continue
                            for sub in range(16):
                                c0 = grp * 128 + LANE * sub
                                for i in range(LANE):
                                    if c0 + i < k:
                                        if c0 + i >= (grp + 1) * 128:
                                            fail(f"M {m} K {k}: lane past its group")
                                        cols[row][c0 + i] += 1
                            scales[row][grp] += 1
                    r0s = [r + (step_rows or R) * stride for r in r0s]
                    passes += 1
                    if passes > m + 2:
                        fail(f"M {m} K {k}: the row loop does not end")
    for r in range(m):
        if any(c != 1 for c in cols[r]):
            fail(f"M {m} K {k} sms {sms}: row {r} columns covered {sorted(set(cols[r]))} times")
        if any(s != 1 for s in scales[r]):
            fail(f"M {m} K {k} sms {sms}: row {r} scales written {sorted(set(scales[r]))} times")
    return gx, gy


def main():
    consts = constants()
    cases = [(1, 7168, 132), (7, 200, 132), (5, 100, 132), (3, 384, 132), (33, 512, 132), (70, 1024, 2),
             (65, 2048, 1), (300, 1100, 1), (17, 4096, 3), (129, 128, 1), (2, 16384, 132),
             # past the cap of 32 CTAs an SM: the row loop runs (lw 4, 3 and 0)
             (700, 2048, 1), (600, 1024, 1), (3000, 100, 1)]
    for m, k, sms in cases:
        gx, gy = run(m, k, sms, consts)
        per_pass = gy * (16 >> lw_of((k + 127) // 128)) * consts[0]
        loop = f", {-(-m // per_pass)} passes" if m > per_pass else ""
        print(f"M {m:>4} K {k:>5} sms {sms:>3}: grid ({gx}, {gy}){loop}: every column and scale once")
    # The host's grids at the shapes its unit test pins (132 SMs).
    for (m, k), want in [((4096, 7168), (4, 1024)), ((4096, 16384), (8, 528)), ((65543, 1024), (1, 4224)),
                         ((4096, 512), (1, 256))]:
        got = plan(m, k, 132, consts[0])
        if got != want:
            fail(f"plan M {m} K {k}: {got}, the host's unit test says {want}")
    # The check catches a row loop that advances by fewer rows than a pass covers (rows taken
    # twice) or by more (rows never taken). (Any grid y is right by construction: the stride is
    # gridDim.y's.)
    for bad in (consts[0] - 1, consts[0] + 1):
        try:
            run(700, 2048, 1, consts, step_rows=bad)
        except Miss as e:
            print(f"injected: a loop step of {bad} strides is caught ({e})")
            continue
        fail(f"a loop step of {bad} strides against the kernel's {consts[0]} went unnoticed")
    print("quant_wide_map: ok")


if __name__ == "__main__":
    try:
        main()
    except Miss as e:
        print("FAIL:", e)
        sys.exit(1)
