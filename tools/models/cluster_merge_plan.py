#!/usr/bin/env python3
"""A design model, not a kernel's twin: the cluster merge for cut sequences that docs/perf.md
("Forty-first session", "Where the b32 combine could go next") proposes, against today's
cost-stream cut plus the combine kernel, counted in tiles of CTA time.

Today (schedule.cuh): the batch's cost stream (tiles + SEG a sequence) is cut evenly over the G
parts; a cut sequence's parts write partials and the combine kernel merges them after the whole
grid (COMBINE tiles past the grid's end, from the timelines: ~7.5 us at h64 b32, ~2.7 us a tile).

Cluster mode (proposed): G = K x CL CTAs in K clusters of CL. Each nonempty sequence goes to the
cluster holding its cost midpoint (the whole-sequence rule at cluster granularity); inside a
cluster its m sequences share the CL CTAs, each sequence a whole number n_b >= 1 of them in
proportion to its tiles (largest remainders), so that every CTA holds exactly one segment and
can stage its partial in its free ring at the end; the n_b CTAs of a sequence then merge through
distributed shared memory (MERGE tiles past the slowest of them). The mode needs m <= CL in
every cluster. A CTA's time: its tiles (its one segment start is paid by every CTA in both
schedules; the cut's SEG is the cost of a second segment, which this mode never has); the op:
the slowest CTA + its merge.

Prints both for the bench's b32 shapes and the share of random batches where the cluster mode
is no slower. usage: cluster_merge_plan.py [--cases N] [--seed S]"""
import argparse
import random

BN = 64
SEG = 8  # SEG_COST_ONE_BLOCK: a segment start in tiles (one row block)
COMBINE = 2.8  # the combine past the grid, tiles (h64 b32: 7.5 us / 2.7 us a tile)
MERGE = 0.7  # the cluster's DSMEM merge past its slowest CTA, tiles (~2 us)


def tiles_of(n):
    return (n + BN - 1) // BN


def today(lens, g):
    """Slowest part's cost plus the combine when any sequence is cut (the cost-stream cut)."""
    t = [tiles_of(n) for n in lens if n > 0]
    c_total = sum(t) + SEG * len(t)
    qc = -(-c_total // g)
    cut = any(
        (start // qc) != ((start + ti + SEG - 1) // qc)
        for start, ti in zip(prefix(t, SEG), t)
    )
    return qc + (COMBINE if cut else 0.0)


def prefix(t, seg):
    out, s = [], 0
    for ti in t:
        out.append(s)
        s += ti + seg
    return out


def cluster_mode(lens, g, cl):
    """The op's cost in cluster mode, or None where a cluster would get more than CL sequences."""
    t = [tiles_of(n) for n in lens if n > 0]
    if not t:
        return 0.0
    k = g // cl
    c_total = sum(ti + SEG for ti in t)
    groups = [[] for _ in range(k)]
    for start, ti in zip(prefix(t, SEG), t):
        mid2 = 2 * start + ti + SEG
        groups[min(k - 1, mid2 * k // (2 * c_total))].append(ti)
    worst = 0.0
    for seqs in groups:
        if not seqs:
            continue
        if len(seqs) > cl:
            return None
        tot = sum(seqs)
        share = [cl * s / tot for s in seqs]
        n = [max(1, int(x)) for x in share]
        while sum(n) > cl:  # the 1-CTA floors took too many: take from the largest
            i = max(range(len(n)), key=lambda j: n[j])
            n[i] -= 1
        order = sorted(range(len(seqs)), key=lambda j: share[j] - n[j], reverse=True)
        for j in order[: cl - sum(n)]:
            n[j] += 1
        for s, nb in zip(seqs, n):
            worst = max(worst, -(-s // nb) + (MERGE if nb > 1 else 0.0))
    return worst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=41)
    a = ap.parse_args()
    g = 132
    for cl in (2, 4, 8):
        print(f"clusters of {cl} ({g // cl} clusters of the {g} parts of a one-row-block grid):")
        for b, s in ((32, 4096), (16, 4096), (64, 4096), (32, 8192), (48, 2048)):
            lens = [s] * b
            cm = cluster_mode(lens, g, cl)
            print(f"  b{b} s{s}: today {today(lens, g):.1f} tiles, cluster mode "
                  + (f"{cm:.1f}" if cm is not None else "not possible"))
        rng = random.Random(a.seed)
        wins = possible = 0
        for _ in range(a.cases):
            b = rng.randint(8, 132)
            mean = rng.choice((1024, 2048, 4096, 8192))
            lens = [max(0, int(rng.gauss(mean, mean * rng.choice((0.05, 0.25, 0.6))))) for _ in range(b)]
            cm = cluster_mode(lens, g, cl)
            if cm is None:
                continue
            possible += 1
            wins += cm <= today(lens, g)
        print(f"  random batches (B 8-132, spread 5-60%): possible in {possible} of {a.cases}, "
              f"no slower than today in {wins}")


if __name__ == "__main__":
    main()
