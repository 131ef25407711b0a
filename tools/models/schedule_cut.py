#!/usr/bin/env python3
"""A model of the decode kernels' split-KV schedule (kernels-cuda/mla_decode_attention/
schedule.cuh: find_part's cuts, next_segment, the seq_info the combine reads), checked over
random batches: the parts' tile ranges tile the batch in order; each sequence is covered by
the parts [first, first + n) of its seq_info, each holding a segment of it in slot p + b (<
num_parts + B, the partial buffers' size); a part holds a sequence whole exactly when n = 1.
Both cuts: the even cut by tiles (SEG_COST 0) and the cost-stream cut (SEG_COST > 0, used
where B <= blockDim, min_tiles <= 1 and qc > SEG_COST). Whole-sequence mode (whole_sequences,
tried first): each sequence goes to the part holding its cost midpoint; the mode holds where the
largest part's load is within its bound, and the early-out that skips the loads' barriers (at
most min(parts, nonempty) parts hold a load) never rules out a batch the full check accepts;
where it holds the parts' ranges tile the batch in order.
usage: schedule_cut.py [--self-test] [--cases N]"""
import argparse
import random

BN = 64


def tiles_of(n):
    return (n + BN - 1) // BN


def find_part(lens, np_, x, seg_cost, min_tiles=1):
    """(begin, end, q, b, pre, seq_info_written) for part x, as find_part computes it."""
    t = [tiles_of(n) for n in lens]
    total = sum(t)
    q = max(-(-total // np_), min_tiles, 1)
    if seg_cost > 0 and min_tiles <= 1:
        c = [ti + seg_cost if ti > 0 else 0 for ti in t]
        c_total = sum(c)
        qc = -(-c_total // np_)
        if qc > seg_cost:
            x0, x1 = x * qc, min(x * qc + qc, c_total)
            b_, pre_, beg, end = len(lens), total, total, total
            info = {}
            cpre = pre = 0
            for b in range(len(lens)):
                if c[b] > 0:
                    tile_at = lambda y: pre + min(max(y - cpre - seg_cost, 0), t[b])
                    if cpre <= x0 < cpre + c[b]:
                        b_, pre_, beg = b, pre, tile_at(x0)
                    if cpre <= x1 < cpre + c[b]:
                        end = tile_at(x1)
                    first, last = (cpre + seg_cost) // qc, (cpre + c[b] - 1) // qc
                    if first == x:
                        info[b] = (first + b, last - first + 1)
                cpre += c[b]
                pre += t[b]
            return beg, end, -1, b_, pre_, info
    beg = x * q
    end = min(beg + q, total)
    if beg >= total:
        return beg, end, q, len(lens), total, {}
    pre = 0
    for b in range(len(lens)):
        if t[b] > 0 and pre <= beg < pre + t[b]:
            return beg, end, q, b, pre, {}
        pre += t[b]
    raise AssertionError("unreachable")


def segments(lens, np_, x, part):
    """next_segment's walk: [(b, t0, t1, whole, slot)] and the seq_info it writes."""
    beg, end, q, b, pre, info = part
    info = dict(info)
    out = []
    while b < len(lens) and pre < end:
        t = tiles_of(lens[b])
        first = pre
        pre += t
        cur = b
        b += 1
        if t == 0:
            continue
        t0, t1 = max(beg, first) - first, min(end, pre) - first
        whole = first >= beg and pre <= end
        slot = x + cur
        if q >= 0 and first >= beg:
            n = (pre - 1) // q - x + 1 if q > 0 else 1
            info[cur] = (slot, n)
        out.append((cur, t0, t1, whole, slot))
    return out, info


def check(lens, np_, seg_cost):
    t = [tiles_of(n) for n in lens]
    total = sum(t)
    covered = [[] for _ in lens]  # per sequence: (part, t0, t1, whole, slot)
    info = {}
    prev_end = 0
    for x in range(np_):
        part = find_part(lens, np_, x, seg_cost)
        beg, end = part[0], part[1]
        if beg < total:
            assert beg == prev_end, (x, beg, prev_end)
            assert end > beg, f"part {x} is empty inside the batch"
            prev_end = end
        segs, inf = segments(lens, np_, x, part)
        for b, v in inf.items():
            assert b not in info, f"seq_info[{b}] written twice"
            info[b] = v
        for (b, t0, t1, whole, slot) in segs:
            assert 0 <= t0 < t1 <= t[b], (x, b, t0, t1)
            assert slot < np_ + len(lens)
            covered[b].append((x, t0, t1, whole, slot))
    assert prev_end == total, (prev_end, total)
    for b, cv in enumerate(covered):
        if t[b] == 0:
            assert not cv
            continue
        assert [(t0, t1) for _, t0, t1, _, _ in cv] == [(a, b_) for a, b_ in zip([0] + [c[2] for c in cv[:-1]], [c[2] for c in cv])]
        assert cv[-1][2] == t[b]
        slot, n = info[b]
        assert [c[0] for c in cv] == list(range(cv[0][0], cv[0][0] + n)), (b, cv, info[b])
        assert slot == cv[0][4] and [c[4] for c in cv] == list(range(slot, slot + n))
        assert all(c[3] == (n == 1) for c in cv)


def whole_sequences(lens, np_, split_cost=8, eager=1):
    """(early_out, whole, ranges) as whole_sequences computes them: early_out where the bound
    rules the mode out before the loads are summed; ranges[x] = part x's [begin, end). eager > 1:
    the self-test's wrong early-out, which fires where the loads would have passed."""
    t = [tiles_of(n) for n in lens]
    t_total = sum(t)
    nonempty = sum(1 for ti in t if ti > 0)
    c = [ti + split_cost if ti > 0 else 0 for ti in t]
    c_total = t_total + split_cost * nonempty
    assert c_total == sum(c)
    bound = t_total + split_cost * (2 * np_ + nonempty)
    holders = min(np_, nonempty)
    early_out = holders > 0 and eager * c_total * np_ > bound * holders
    load = [0] * np_
    ranges = [None] * np_
    start = c_start = 0
    last_part = -1
    for b in range(len(lens)):
        if c[b] > 0:
            part = ((2 * c_start + c[b]) * np_) // (2 * c_total)
            assert last_part <= part < np_, "the midpoint's part is monotonic in b and < np"
            last_part = part
            load[part] += c[b]
            beg = ranges[part][0] if ranges[part] else start
            ranges[part] = (beg, start + t[b])
        start += t[b]
        c_start += c[b]
    whole = max(load, default=0) * np_ <= bound
    return early_out, whole, ranges


def check_whole(lens, np_, eager=1):
    early_out, whole, ranges = whole_sequences(lens, np_, eager=eager)
    assert not (early_out and whole), f"the early-out ruled out an accepted batch: {lens}, {np_}"
    if whole:
        t_total = sum(tiles_of(n) for n in lens)
        prev = 0
        for r in ranges:
            if r is not None:
                assert r[0] == prev and r[1] > r[0], (ranges, lens, np_)
                prev = r[1]
        assert prev == t_total, (prev, t_total)
    return early_out, whole


def loads(lens, np_, seg_cost):
    """Per part: tiles + seg_cost x segments (what the cut balances)."""
    r = []
    for x in range(np_):
        segs, _ = segments(lens, np_, x, find_part(lens, np_, x, seg_cost))
        r.append(sum(t1 - t0 for _, t0, t1, _, _ in segs) + 7 * len(segs))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--cases", type=int, default=3000)
    a = ap.parse_args()
    rng = random.Random(1)
    for i in range(a.cases):
        B = rng.randint(1, 40)
        mx = rng.choice([1, 64, 200, 4200, 20000])
        lens = [rng.choice([0, rng.randint(1, mx)]) if rng.random() < 0.2 else rng.randint(1, mx) for _ in range(B)]
        np_ = rng.randint(1, 140)
        for sc in (0, 4, 6, 8):
            check(lens, np_, sc)
        check_whole(lens, np_)
    # The early-out's reach: b1 over many parts (always out), the bench's b128 (the full check).
    for lens, np_, want in (([8192], 132, (True, False)), ([4096 + 2 * i for i in range(128)], 132, (False, True))):
        got = check_whole(lens, np_)
        assert got == want, (len(lens), np_, got, want)
    # The bench's h128 b32 s4096 row (sequence i: 4096 + 2 i tokens, 64 parts).
    lens = [4096 + 2 * i for i in range(32)]
    for sc in (0, 6):
        ld = loads(lens, 64, sc)
        print(f"h128 b32 s4096, 64 parts, SEG_COST {sc}: max tiles + 7 x segments {max(ld)}, min {min(ld)}")
    if a.self_test:
        # An injected bug must be caught: seq_info's n off by one.
        global segments
        orig = segments

        def bad(lens, np_, x, part):
            segs, inf = orig(lens, np_, x, part)
            return segs, {b: (s, n + 1) for b, (s, n) in inf.items()}

        segments = bad
        try:
            check([4096 + 2 * i for i in range(8)], 16, 6)
        except AssertionError:
            print("self-test: an off-by-one seq_info is caught")
        else:
            raise SystemExit("self-test: an off-by-one seq_info was not caught")
        segments = orig
        # And an early-out that fires too soon (the bound halved).
        try:
            for np_ in range(1, 140):
                check_whole([4096 + 2 * i for i in range(128)], np_, eager=2)
        except AssertionError:
            print("self-test: a too-eager early-out is caught")
        else:
            raise SystemExit("self-test: a too-eager early-out was not caught")
    print(f"schedule_cut: {a.cases} random batches x 4 costs: the cuts tile every batch, seq_info matches; whole-sequence mode's early-out never rules out an accepted batch")


if __name__ == "__main__":
    main()
