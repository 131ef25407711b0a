#!/usr/bin/env python3
"""Checks the three-warpgroup kernels' gather copies (kernels-cuda/mla_decode_attention/
wgmma_3wg_sm90.cuh: w3_gather, w3_gather_raw) without a GPU, by running their address arithmetic
as written in the kernel over every thread of warpgroups 1 and 2 and every tile row:

- 16-bit (w3_gather): each warpgroup w copies, of every row r, the V columns 256 w .. + 255 and the
  rope columns 512 + 32 w .. + 31; together the two copy every 16-byte chunk of the 576-element
  row exactly once, to the place the TMA form's boxes put it (column block f / 64, row r, chunk
  (f / 8) % 8 under the 128-byte swizzle: vt::tc::swz), and warpgroup w's copies land only in
  what its own P V and warpgroup 0's S read (so refilling after its own P V is safe).
- fp8_ds_mla (w3_gather_raw): each warpgroup copies its two code groups (16 chunks), half the rope
  (4 chunks) and its two scales (one 8-byte copy); together every byte of the 656-byte row lands
  exactly once, where the TMA form's maps put it (code group g in box g, the rope in box 4, both
  swizzled; the scales at F8R_SCALES + 16 r, unswizzled), and each warpgroup's bytes are the ones
  its dequantization reads (groups 2 w, 2 w + 1 and their scales) or warpgroup 0's.
- Every copy is aligned to its size at both ends (rows 16-byte aligned: the kernels' precondition)
  and a row's four threads move contiguous global bytes in each step (the coalescing the design
  claims: 64 bytes a step, two full sectors).

Usage: python3 tools/models/gather_maps.py   (exit 1 on the first failed check)
"""
import sys

BN, SUB_BYTES, FDV = 64, 64 * 128, 512
F8R_BOX = BN * 128
F8R_SCALES = 5 * F8R_BOX
SCALE_OFFSET, ROPE_OFFSET, ROW_BYTES = 512, 528, 656


def swz(r, c):
    return r * 128 + ((c ^ (r & 7)) << 4)


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def thread_rows():
    """w3_gather_rows: every thread of warpgroups 1 and 2 with each of its two rows and the
    swizzled offsets of the row's chunks sub and sub + 4: (w, wtid, sub, r, x0, x1)."""
    for w in range(2):
        for wtid in range(128):
            sub = wtid & 3
            for h in range(2):
                r = (wtid >> 2) + 32 * h
                yield w, wtid, sub, r, (sub ^ (r & 7)) << 4, ((sub | 4) ^ (r & 7)) << 4


def gather16():
    """w3_gather's copies: (warpgroup, thread, row, dst byte, src element, bytes, step)."""
    out = []
    for w, wtid, sub, r, x0, x1 in thread_rows():
        src = 256 * w + 8 * sub  # elements from the row's start
        srow = 4 * w * SUB_BYTES + r * 128
        for j in range(8):
            out.append((w, wtid, r, srow + (j >> 1) * SUB_BYTES + (x1 if j & 1 else x0), src + 32 * j, 16, j))
        out.append((w, wtid, r, 8 * SUB_BYTES + swz(r, 4 * w + sub), src + FDV - 224 * w, 16, 8))
    return out


def check16():
    copies = gather16()
    seen = {}
    for w, wtid, r, dst, src_el, nbytes, step in copies:
        src = 2 * src_el  # bytes
        if dst % 16 or src % 16:
            fail(f"16-bit: unaligned copy w {w} thread {wtid} row {r}: dst {dst} src {src}")
        f = src_el  # the chunk's first feature
        want = (f // 64) * SUB_BYTES + swz(r, (f // 8) % 8)
        if dst != want:
            fail(f"16-bit: feature {f} of row {r} to {dst}, the TMA layout has it at {want}")
        owner = w if f < FDV else (0 if f < FDV + 32 else 1)
        if (f < FDV and not (256 * w <= f < 256 * w + 256)) or (f >= FDV and owner != w):
            fail(f"16-bit: warpgroup {w} copies feature {f}, which it neither multiplies nor owns")
        key = (r, f)
        if key in seen:
            fail(f"16-bit: row {r} feature {f} copied twice")
        seen[key] = (w, wtid, step)
    if len(seen) != BN * 72:
        fail(f"16-bit: {len(seen)} chunks copied, a tile has {BN * 72}")
    # Coalescing: in each step a row's four threads move 64 contiguous bytes (the rope step too).
    by = {}
    for w, wtid, r, dst, src_el, nbytes, step in copies:
        by.setdefault((w, r, step), []).append(2 * src_el)
    for (w, r, step), srcs in by.items():
        srcs.sort()
        if len(srcs) != 4 or srcs[-1] - srcs[0] != 48 or any(b - a != 16 for a, b in zip(srcs, srcs[1:])):
            fail(f"16-bit: warpgroup {w} row {r} step {step} moves {srcs}, not 64 contiguous bytes")
    print(f"16-bit gather: {len(copies)} copies, every chunk of {BN} rows once, TMA layout, 64 B a row a step")


def gather_raw():
    """w3_gather_raw's copies, as gather16's (src in bytes)."""
    out = []
    for w, wtid, sub, r, x0, x1 in thread_rows():
        box = 2 * w * F8R_BOX + r * 128
        for j in range(4):
            out.append((w, wtid, r, box + (j >> 1) * F8R_BOX + (x1 if j & 1 else x0), 256 * w + 64 * j + 16 * sub, 16, j))
        out.append((w, wtid, r, 4 * F8R_BOX + swz(r, 4 * w + sub), ROPE_OFFSET + 64 * w + 16 * sub, 16, 4))
        if sub == 0:
            out.append((w, wtid, r, F8R_SCALES + r * 16 + 8 * w, SCALE_OFFSET + 8 * w, 8, 5))
    return out


def check_raw():
    copies = gather_raw()
    seen = {}
    for w, wtid, r, dst, src, nbytes, step in copies:
        if dst % nbytes or src % nbytes:
            fail(f"fp8: unaligned {nbytes}-byte copy w {w} thread {wtid} row {r}: dst {dst} src {src}")
        if src < SCALE_OFFSET:  # codes: group src // 128, byte src % 128
            g = src // 128
            want = g * F8R_BOX + swz(r, (src % 128) // 16)
            if g // 2 != w:
                fail(f"fp8: warpgroup {w} copies code group {g}, which its dequantization does not read")
        elif src < ROPE_OFFSET:  # scales: floats of groups (src - 512) / 4 ..
            want = F8R_SCALES + r * 16 + (src - SCALE_OFFSET)
            if (src - SCALE_OFFSET) // 8 != w:
                fail(f"fp8: warpgroup {w} copies the scales of another warpgroup's groups")
        else:  # rope
            want = 4 * F8R_BOX + swz(r, (src - ROPE_OFFSET) // 16)
        if dst != want:
            fail(f"fp8: row {r} byte {src} to {dst}, the TMA maps put it at {want}")
        for b in range(nbytes):
            key = (r, src + b)
            if key in seen:
                fail(f"fp8: row {r} byte {src + b} copied twice")
            seen[key] = w
    if len(seen) != BN * ROW_BYTES:
        fail(f"fp8: {len(seen)} bytes copied, a tile has {BN * ROW_BYTES}")
    by = {}
    for w, wtid, r, dst, src, nbytes, step in copies:
        if nbytes == 16:
            by.setdefault((w, r, step), []).append(src)
    for (w, r, step), srcs in by.items():
        srcs.sort()
        if len(srcs) != 4 or any(b - a != 16 for a, b in zip(srcs, srcs[1:])):
            fail(f"fp8: warpgroup {w} row {r} step {step} moves {srcs}, not 64 contiguous bytes")
    print(f"fp8 gather: {len(copies)} copies, every byte of {BN} rows of {ROW_BYTES} once, TMA layout, 64 B a row a step")


if __name__ == "__main__":
    check16()
    check_raw()
    print("ok")
