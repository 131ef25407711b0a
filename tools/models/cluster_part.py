#!/usr/bin/env python3
"""A model of the cluster form's schedule (kernels-cuda/mla_decode_attention/schedule.cuh:
cluster_part; the merge's row shares in cluster_merge.cuh), checked over random batches.

Where the mode is taken: every nonempty sequence lies in one cluster of CM_CTAS CTAs, on the
consecutive ranks [r0, r0 + n) that its CTAs' ClusterSeg names; their segments are nonempty and
tile its tiles in order; a cluster's sequences use at most its CM_CTAS ranks; a CTA's Part
(begin, end, b, pre) walks exactly its one segment (next_segment), whole exactly when n = 1; the
sequence's seq_info is written once (by its rank-r0 CTA, as one slot: the combine passes it by);
the n CTAs' merge rows tile [0, m_rows). The decision is the rule: at most CM_CTAS sequences a
cluster and the largest CTA's tiles plus the merge within the cut's even share plus the combine.
The scratch the kernel uses fits for every B <= blockDim and cluster count the host launches.
The sites below must appear in the kernel text (the model follows them).
usage: cluster_part.py [--self-test] [--cases N]"""
import argparse
import pathlib
import random

BN, CM_CTAS, SEG, MERGE, COMBINE, THREADS, CAP = 64, 4, 8, 1, 3, 384, 64 * 128 // 4

ROOT = pathlib.Path(__file__).resolve().parents[2]
SITES = {
    "kernels-cuda/mla_decode_attention/schedule.cuh": [
        "k = (int)(((2 * cpre + c) * NC) / (2 * c_total));",
        "if (wk[j] != kk || wt[j] <= wn[j]) continue;",
        "if (per > most) best = j, most = per;",
        "const bool on = sc[1] == 0 && (i64)sc[0] + (sc[2] ? CM_MERGE_COST : 0) <= qc + CUT_COMBINE_COST;",
        "s[35] = pre + (int)((i64)t * j / n);",
        "s[36] = pre + (int)((i64)t * (j + 1) / n);",
        "if (B > (int)blockDim.x || 4 * B + 2 * NC + 4 > cap || p.min_tiles > 1 || NC < 1) return false;",
        "enum : int { CM_CTAS = 4, CM_MERGE_COST = MLA_CM_MERGE_COST, CUT_COMBINE_COST = MLA_CUT_COMBINE_COST };",
        "#define MLA_CM_MERGE_COST 1",
        "#define MLA_CUT_COMBINE_COST 3",
    ],
    "kernels-cuda/mla_decode_attention/cluster_merge.cuh": [
        "const int lo = m_rows * j / cs.n, hi = m_rows * (j + 1) / cs.n;",
    ],
}


def tiles_of(n):
    return (max(n, 0) + BN - 1) // BN


def cluster_part(lens, parts):
    """None where the mode is not taken, else per CTA x: (b, pre, begin, end, r0, n) and the
    seq_info writes {b: (slot, 1)} by CTA, as cluster_part computes them."""
    B, NC = len(lens), parts // CM_CTAS
    if B > THREADS or 4 * B + 2 * NC + 4 > CAP or NC < 1:
        return None
    t = [tiles_of(n) for n in lens]
    c = [ti + SEG if ti > 0 else 0 for ti in t]
    c_total, t_total = sum(c), sum(t)
    k, cpre = [-1] * B, 0
    for b in range(B):
        if c[b] > 0:
            k[b] = (2 * cpre + c[b]) * NC // (2 * c_total)
            assert 0 <= k[b] < NC
        cpre += c[b]
    n, r, most, split = [0] * B, [0] * B, 0, False
    for kk in range(NC):
        mine = [b for b in range(B) if k[b] == kk]
        if len(mine) > CM_CTAS:
            return None
        for b in mine:
            n[b] = 1
        for _ in range(CM_CTAS - len(mine)):
            best, bm = -1, 0
            for b in mine:
                if t[b] <= n[b]:
                    continue
                per = -(-t[b] // n[b])
                if per > bm:
                    best, bm = b, per
            if best < 0:
                break
            n[best] += 1
        rank = 0
        for b in mine:
            r[b] = rank
            rank += n[b]
            most = max(most, -(-t[b] // n[b]))
            split |= n[b] > 1
    qc = -(-c_total // parts)
    if most + (MERGE if split else 0) > qc + COMBINE:
        return None
    ctas, info = [], {}
    pre = [sum(t[:b]) for b in range(B)]
    for x in range(parts):
        kx, rank = x // CM_CTAS, x % CM_CTAS
        seg = (B, t_total, t_total, t_total, 0, 0)
        for b in range(B):
            if c[b] > 0 and k[b] == kx:
                if r[b] <= rank < r[b] + n[b]:
                    j = rank - r[b]
                    seg = (b, pre[b], pre[b] + t[b] * j // n[b], pre[b] + t[b] * (j + 1) // n[b], r[b], n[b])
                if rank == r[b]:
                    assert b not in info, "seq_info written twice"
                    info[b] = (x + b, 1)
        ctas.append(seg)
    return ctas, info, (most, qc, split)


def next_segments(lens, part):
    """next_segment's walk over a part (b, pre, begin, end): [(b, t0, t1, whole)]."""
    b, pre, begin, end = part[:4]
    out = []
    while b < len(lens) and pre < end:
        t = tiles_of(lens[b])
        first = pre
        pre += t
        if t > 0:
            out.append((b, max(begin, first) - first, min(end, pre) - first, first >= begin and pre <= end))
        b += 1
    return out


def check(lens, parts, m_rows):
    got = cluster_part(lens, parts)
    if got is None:
        return False
    ctas, info, _ = got
    t = [tiles_of(n) for n in lens]
    covered = {b: [] for b in range(len(lens)) if t[b] > 0}
    for x, seg in enumerate(ctas):
        walk = next_segments(lens, seg)
        if seg[5] == 0:
            assert walk == [], (lens, parts, x, seg)
            continue
        assert len(walk) == 1, (lens, parts, x, seg, walk)
        b, t0, t1, whole = walk[0]
        assert b == seg[0] and t0 < t1 and whole == (seg[5] == 1), (lens, parts, x, seg, walk)
        covered[b].append((x, t0, t1, seg[4], seg[5]))
    for b, segs in covered.items():
        assert segs, f"sequence {b} in no CTA: {lens} over {parts}"
        xs = [s[0] for s in segs]
        r0, n = segs[0][3], segs[0][4]
        assert all(s[3] == r0 and s[4] == n for s in segs) and len(segs) == n, (lens, parts, b, segs)
        assert len({x // CM_CTAS for x in xs}) == 1, "a sequence over two clusters"
        assert [x % CM_CTAS for x in xs] == list(range(r0, r0 + n)), (lens, parts, b, segs)
        assert segs[0][1] == 0 and segs[-1][2] == t[b], (lens, parts, b, segs)
        assert all(segs[i][2] == segs[i + 1][1] for i in range(n - 1)), (lens, parts, b, segs)
        assert info.get(b, (None, 0))[1] == 1, f"seq_info of {b}"
        rows = [(m_rows * j // n, m_rows * (j + 1) // n) for j in range(n)]
        assert rows[0][0] == 0 and rows[-1][1] == m_rows and all(rows[i][1] == rows[i + 1][0] for i in range(n - 1))
    assert set(info) == set(covered), (lens, parts)
    return True


def sites():
    for rel, lines in SITES.items():
        text = (ROOT / rel).read_text()
        for line in lines:
            assert line in text, f"{rel}: the model's site is gone: {line}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--cases", type=int, default=2000)
    args = ap.parse_args()
    sites()
    rng = random.Random(42)
    taken = 0
    for _ in range(args.cases):
        parts = CM_CTAS * rng.choice([1, 2, 3, 8, 16, 30, 32, 33])
        b = rng.choice([1, 2, 3, 5, 8, 16, 28, 32, 40, 64, 100, 384, 385])
        base = rng.choice([1, 64, 300, 1000, 4096])
        spread = rng.random()
        lens = [0 if rng.random() < 0.1 else max(0, int(base * (1 + spread * (2 * rng.random() - 1)))) for _ in range(b)]
        taken += check(lens, parts, rng.choice([1, 8, 33, 40, 64]))
    # The batches the GPU test's mirror names (tests/mla_decode_attention.rs).
    for lens, parts, want in [([1000] * 4, 16, True), ([2000, 300, 1000, 1000], 8, True),
                              ([1, 17, 64, 65, 300, 1000, 0, 130], 8, True), ([4000], 4, True),
                              ([333] * 12, 12, True), ([1, 17, 64, 65, 300, 1000, 0, 130], 4, False),
                              ([130, 130, 2000, 2000], 8, False), ([4096] * 32, 128, True)]:
        assert check(lens, parts, 64) == want, (lens, parts)
    print(f"cluster_part: {args.cases} random batches ({taken} taken): each sequence on consecutive ranks of one "
          f"cluster, its segments tile it, seq_info once, merge rows tile the rows; the sites match the kernel")


if __name__ == "__main__":
    main()
