#!/usr/bin/env python3
"""Executable model of the synchronization protocol of `decode_wgmma_fp8_pair`, the CTA-pair form of the
dequantizing 64-row kernel (kernels-cuda/mla_decode_attention/wgmma_fp8_pair_sm90.cuh, with consumer_tiles,
stage_and_store and copy_out of wgmma_sm90.cuh, and Fp8RegLoader and the consumer warpgroups' segment
bodies fp8_s_segment / fp8_pv_segment of wgmma_fp8_sm90.cuh, shared with decode_wgmma_fp8), explored over
random interleavings to find deadlocks, barrier-phase mistakes and shared-memory races (local and across
the two CTAs of a cluster) before the kernel runs on a GPU. Standard library only (Python 3.11); the
conventions of tools/models/fp8raw_protocol.py; the machinery of protocol_sim.py (barriers, race bookkeeping,
scheduler, reports, self-test) and the command line of protocol_cli.py.

What it models
--------------
A cluster of two CTAs, rank 0 and 1, that walk the same list of segments (t0, t1). Actors per CTA (each a
generator that steps through the code, one synchronization or shared-memory access per step; a step is
atomic; names carry the rank: WG0@1 is warpgroup 0 of rank 1):
  WG0   warpgroup 0 (128 threads; thread 0 initializes the mbarriers): the initial cluster_sync; per
        segment fp8_s_segment (consumer_tiles with PairStages, then its half of the epilogue): per tile
        bar_sync(K_FULL + st), mbar_wait on this CTA's k_remote[st] (its own parity bits, carried across
        segments), S (reads the stage and Q until wgmma_wait), the softmax's valid / flags,
        bar_sync(P_FREE), P and s_alpha, bar_arrive(P_FULL), P V (reads P and the stage), and when
        t + 2 < t1 pair_release: each warp's lane 0 arrives on this CTA's v_free[st] and on the peer's
        (the actor arrives with weight 4 on each: its 4 warps); store_fin (s_fin); the epilogue
        hand-over (bar_arrive(EPI_WG0), bar_sync(EPI_WG1)), stage_and_store (O staged over the stages,
        then copy_out reads it and s_fin); then mbar_arrive on this CTA's epi_done and
        mbar_arrive_cluster on the peer's (128 each); the final cluster_sync.
  WG1   warpgroup 1 (128): per segment fp8_pv_segment (its release: pair_release): bar_arrive(P_FREE);
        per tile bar_sync(P_FULL), s_alpha, P V (P and the stage), bar_arrive(P_FREE) (t + 1 < t1),
        pair_release (t + 2 < t1); bar_arrive(EPI_WG1), bar_sync(EPI_WG0), stage_and_store / copy_out;
        then both epi_done arrivals; the final cluster_sync.
  W2A   warp 0 of warpgroup 2 (32 threads, thread 0 among them: it arms k_remote) and
  W2B   warps 1..3 of warpgroup 2 (96): pair_producer_tiles: load_q (cp.async of Q, a write open until
        cp_async_wait<0> at the segment's first tile); per tile: mbar_wait(v_free[st]) when t >= t0 + 2
        (parity bits carried across segments), W2A: mbar_expect_tx(k_remote[st], 36864) on this CTA's
        barrier, the own rows of the tile into the own stage (generic stores) and, by st.async, into the
        peer's stage (complete_tx on the PEER's k_remote[st]), the valid / flags publication, bar_arrive(
        K_FULL + st); after the segment mbar_wait(epi_done); the final cluster_sync.
  NET   the cluster's network: each st.async chunk (two per actor and tile: its rows' o0 and o1 cells,
        with their share of the 36864 bytes) and each remote mbarrier arrival lands at a random later
        step, in any order (the issuing thread goes on at once). A chunk's bytes may land on the peer's
        k_remote before the peer's thread 0 armed that phase: the transaction count goes negative while
        the arrival is pending, which PTX allows. A remote arrival is a memory operation of its thread,
        so barrier.cluster.arrive.release (cluster_sync) counts the thread only once its earlier remote
        arrivals have landed; st.async bytes are not taken as ordered by it (the model assumes nothing
        there: the kernel awaits every byte on k_remote anyway).
  A warpgroup (or W2A / W2B) is one interval per access: races between its own threads are not modelled.
  The warps of W2A / W2B write disjoint rows (Fp8RegLoader: warp w holds tokens 8 w .. 8 w + 7 of a round).
mbarriers as in PTX (and fp8raw_protocol.py): a pending-arrival count and a tx count per phase; a phase
  completes when both reach 0 (the completed-phase count grows by one, the parity flips, the pending count
  is reset); try_wait.parity P returns once the current parity != P; expect_tx is tx += bytes and one
  arrival. Per CTA: epi_done (512), k_remote[2] (1 + 36864 bytes), v_free[2] (16). Any operation on an
  mbarrier before its CTA's thread 0 initialized it is a violation.
Named barriers per CTA: 1 / 2 K_FULL[st], 5 P_FULL, 6 P_FREE, 11 EPI_WG1, 12 EPI_WG0 (256 threads each; an
  actor adds its weight in threads); the cluster barrier (cluster_sync: every thread of both CTAs, 768).
Shared memory, per CTA, as cells (a write or read covers a set of cells):
  stage[s].half{h}.{w0|w123}.o{g}   stage s's rows of rank h (written by rank h's W2A / W2B: in rank h's CTA
        by generic stores, in the other CTA by st.async), cut by the O staging that overlays both stages:
        o0 the part warpgroup 0's staged O columns cover, o1 warpgroup 1's (the two WGs' O stagings are
        disjoint, each overlaps every half of both stages). S and each P V read all cells of stage s.
  Q.{w0|w123}, valid[s].{w0|w123} (valid and flags of stage s, written by the local producer only), P,
  s_alpha, s_fin (WG0).
  Every write is tagged (tile k, t), (seg k) or (O of seg k) and records who must read it how often
  before it may be overwritten (tile: WG0 twice (S, P V), WG1 once; Q: WG0 once per tile; O cells o{g}:
  WG{g} once, ...).
Checks (a run stops at its first violation):
  race       a write (local or remote) that starts while a read of the cell is open, while another write
             of it is in flight, or before a reader that must read the previous contents has read them; a
             read that finds the cell being written or holding another tag than the one it expects.
  named      two instances (K_FULL of tile (k, t), EPI_WG0 of segment k, ...) pending on one id, arrivals
             beyond the count, two counts on one instance, an instance left incomplete at the end.
  mbarrier   an mbar_wait that returns before the phase the code means has completed (its parity matched
             an older phase); an arrival or complete_tx that lands in another phase than the one meant;
             arrivals beyond the count while the phase still waits for bytes; an operation on an
             uninitialized mbarrier; a phase left half-done at the end.
  exit       a remote operation (st.async bytes, a remote arrival) issued to or landing in a CTA whose
             threads have all exited.
  deadlock   no actor can step and nothing is in flight, not all are done: each actor's blocking
             operation is printed with its kernel line, and the barriers.
  The instance-mixing check and the two meant-phase checks are the intent checks (what the code means by
  each wait and arrival: tile index per stage, segment); --no-intent-checks keeps only the PTX-level
  rules, the data tags, exits and deadlocks; --self-test runs every bug both ways.
  The kernel line of each step is found through a chain of code snippets (SITES, in the three headers); a
  snippet no longer found is reported (the kernel changed: the model may be out of date) and fails
  --self-test.
The normal mode prints how often each wait had to wait and how often the runs went through the orders
  that matter here (the arming after some or all of the peer's bytes, the peer's bytes or remote
  arrival completing a phase), as a measure of what the runs exercised.
Removals the model finds no violation for are listed as ablations (--self-test prints them): the final
  cluster_sync (every remote operation into a CTA is awaited by that CTA before its threads finish:
  the st.async bytes by warpgroup 0's k_remote waits, the v_free arrivals by the producer's next waits,
  the epi_done arrivals by its last wait), and the last segment's epi_done wait (safe only with the final
  cluster_sync; the bug exit_early drops both and is caught: a CTA exits while the peer still arrives).

What it does not model
----------------------
- The memory model beyond ordering by barriers: proxy fences (fence.proxy.async before wgmma: the
  producer's after its stores, PairStages::full's after the k_remote wait (site wg0.fence)), the
  default (CTA-scope) semantics of remote arrivals and of the waits, whether st.async data are visible
  to wgmma (async proxy) and to warpgroup 1 (which never waits on k_remote: only through WG0's wait and
  P_FULL), the mbarrier init fence (fence.mbarrier_init.release.cluster: the init is one step, ordered
  by the cluster barrier). Every data hand-over is checked as ordering only.
- DSMEM rules other than "nothing reaches an exited CTA" (e.g. mapa address ranges, cluster shape).
- find_part / next_segment (with their __syncthreads, after the initial cluster_sync) and the schedule's
  arithmetic: both CTAs get the same list of segments, t1 > t0.
- BAR_WG0 / BAR_WG1 (a warpgroup's own 128-thread barriers) and __syncwarp: a warpgroup is one actor.
- Register pipelining (ld.load of tile t + 2, RowRef), the global loads, the global stores of copy_out,
  values, masks, setmaxnreg, bar.sync.aligned convergence, addresses (cells are disjoint as named).
- Timing: paces are random per run (changing now and then), not exhaustive; a finding comes with the seed
  and run to replay it. The normal mode prints how often each wait actually had to wait.

How to run
----------
  python3 tools/models/fp8pair_protocol.py                 # 2000 random runs, seed 1
  python3 tools/models/fp8pair_protocol.py --runs 5000 --seed 7
  python3 tools/models/fp8pair_protocol.py --segments 3,1,2 --runs 200   # fixed tile counts
  python3 tools/models/fp8pair_protocol.py --bug no_v_free_wait          # one injected bug
  python3 tools/models/fp8pair_protocol.py --self-test     # injects each bug, expects a catch
  python3 tools/models/fp8pair_protocol.py --list-bugs
  python3 tools/models/fp8pair_protocol.py --run 17 --trace 60   # replay run 17 of the seed
  python3 tools/models/fp8pair_protocol.py --no-intent-checks    # PTX-level + data checks only
Exit status: 0 when no violation or deadlock was found (--self-test: every bug caught and the unmodified
protocol clean), 1 otherwise.
"""

import collections
import os

import protocol_cli
import protocol_sim
from protocol_cli import run
from protocol_sim import (MBar, NamedBar, Part, Violation, actor_lines, begin_read, begin_write, check_wait, end_checks,
                          end_read, end_write, explore_segments, fixed_cases, random_segments, record_step, run_once)

KERNEL = "kernels-cuda/mla_decode_attention/wgmma_fp8_pair_sm90.cuh"
FILES = {"pair": KERNEL, "sm90": "kernels-cuda/mla_decode_attention/wgmma_sm90.cuh",
         "fp8": "kernels-cuda/mla_decode_attention/wgmma_fp8_sm90.cuh"}

# ---------------------------------------------------------------------------------------------
# Kernel lines: per modelled step (file, chain of snippets), each searched from the line of the one
# before; the last one is the step's line.
K = "template <typename T> __device__ void decode_wgmma_fp8_pair("
K0 = "StageBarriers<L::STAGES, false> bars(c.base + L::OFF_MBAR)"  # warpgroup 0's part of the kernel
K1 = "if (c.wg == 1) {"
K2 = "if (c.wg == 2) {"
S0 = "__device__ __forceinline__ void fp8_s_segment("  # warpgroup 0's segment body (wgmma_fp8_sm90.cuh)
S1 = "__device__ __forceinline__ void fp8_pv_segment("  # warpgroup 1's
PT = "__device__ __forceinline__ void pair_producer_tiles("
PS = "struct PairStages {"
PR = "__device__ __forceinline__ void pair_release("
CT = "__device__ __forceinline__ void consumer_tiles("
SS = "__device__ __forceinline__ void stage_and_store("
CO = "__device__ __forceinline__ void copy_out("
SITES = {
    "init": ("pair", (K, "if (threadIdx.x == 0) {", "mbar_init(epi_done, PAIR_EPI)")),
    "init.k_remote": ("pair", (K, "mbar_init(k_remote + 8 * st, 1)")),
    "init.v_free": ("pair", (K, "mbar_init(v_free + 8 * st, PAIR_RELEASES)")),
    "init.sync": ("pair", (K, "cluster_sync();  // both CTAs' barriers are initialized")),
    "wg0.phases": ("pair", (K, K0, "PairStages stages{k_remote, v_free, v_free_peer, 0u, c.lane == 0}")),
    "wg0.segment": ("pair", (K, K0, "fp8_s_segment<T>(p, sg, c, bars, stages)")),
    "wg0.tiles": ("fp8", (S0, "consumer_tiles<T, false>(p, sg, c.row0, c.sKV, c.valid, c.flags, bars, stages,")),
    "wg0.k_full": ("pair", (PS, "bar_sync(BAR_K_FULL + st, 256)")),
    "wg0.k_remote": ("pair", (PS, "mbar_wait<MLA_PAIR_ACQUIRE_CLUSTER != 0>(k_remote + 8 * st, (phases >> st) & 1)")),
    "wg0.fence": ("pair", (PS, "mbar_wait<MLA_PAIR_ACQUIRE_CLUSTER != 0>(k_remote + 8 * st", "fence_proxy_async();  // the peer's st.async bytes")),
    "wg0.qk": ("sm90", (CT, "qk_tile<T>(s, dq, kst)")),
    "wg0.softmax": ("sm90", (CT, "softmax_tile<T>(s, tile_is_full(t, rl.lim_min, flags + st * 8)")),
    "wg0.p_free": ("sm90", (CT, "bar_sync(BAR_P_FREE, 256)")),
    "wg0.p": ("sm90", (CT, "store_p_rows(sP, pk, r_lo >> 4")),
    "wg0.alpha": ("sm90", (CT, "s_alpha[r_lo] = alpha[0]")),
    "wg0.p_full": ("sm90", (CT, "bar_arrive(BAR_P_FULL, 256)")),
    "wg0.pv": ("sm90", (CT, "pv_tile<T, 128>(o, dp, GmmaDesc(kst, SUB_BYTES, 1024))")),
    "wg0.release": ("sm90", (CT, "if (t + 2 < t1) stages.release(st)")),
    "rel.local": ("pair", (PR, "mbar_arrive(local + 8 * st)")),
    "rel.peer": ("pair", (PR, "mbar_arrive_cluster(peer + 8 * st)")),
    "wg0.fin": ("sm90", (CT, "store_fin(s_fin, l_run, m_run, r_lo, qd)")),
    "wg0.epi_arrive": ("fp8", (S0, "bar_arrive(BAR_EPI_WG0, 256)")),
    "wg0.epi_sync": ("fp8", (S0, "bar_sync(BAR_EPI_WG1, 256)")),
    "wg0.stage": ("fp8", (S0, "stage_and_store<T, WGMMA_ROWS>(p, sg, c.row0, c.sKV, c.so, o, c.r_lo, c.qd, 0,")),
    "stage.write": ("sm90", (SS, "st_shared_f2(stage + ((r_lo + 8 * hi) * OSTR")),
    "copy_out": ("sm90", (CO, "const float4 v = *reinterpret_cast<const float4*>(so + r * OSTR + c)")),
    "wg0.epi_local": ("pair", (K, K0, "mbar_arrive(epi_done)")),
    "wg0.epi_peer": ("pair", (K, K0, "mbar_arrive_cluster(epi_peer)")),
    "wg0.final": ("pair", (K, K0, "cluster_sync()")),
    "wg1.segment": ("pair", (K, K1, "fp8_pv_segment<T>(p, sg, c, [&](int st) { pair_release(v_free, v_free_peer, st")),
    "wg1.lead": ("pair", (K, K1, "const bool lead = c.lane == 0;")),
    "wg1.p_free0": ("fp8", (S1, "bar_arrive(BAR_P_FREE, 256)")),
    "wg1.p_full": ("fp8", (S1, "bar_sync(BAR_P_FULL, 256)")),
    "wg1.alpha": ("fp8", (S1, "rescale(o, c.s_alpha[c.r_lo], c.s_alpha[c.r_lo + 8])")),
    "wg1.pv": ("fp8", (S1, "pv_tile<T, 128>(o, c.dp, GmmaDesc(c.sKV + st * TILE_BYTES + 4 * SUB_BYTES")),
    "wg1.p_free": ("fp8", (S1, "if (t + 1 < sg.t1) bar_arrive(BAR_P_FREE, 256)")),
    "wg1.release": ("fp8", (S1, "if (t + 2 < sg.t1) release(st)")),
    "wg1.epi_arrive": ("fp8", (S1, "bar_arrive(BAR_EPI_WG1, 256)")),
    "wg1.epi_sync": ("fp8", (S1, "bar_sync(BAR_EPI_WG0, 256)")),
    "wg1.stage": ("fp8", (S1, "stage_and_store<T, WGMMA_ROWS>(p, sg, c.row0, c.sKV, c.so, o, c.r_lo, c.qd, 256,")),
    "wg1.epi_local": ("pair", (K, K1, "mbar_arrive(epi_done)")),
    "wg1.epi_peer": ("pair", (K, K1, "mbar_arrive_cluster(epi_peer)")),
    "wg1.final": ("pair", (K, K1, "cluster_sync()")),
    "wg2.vphases": ("pair", (K, K2, "uint32_t vphases = 0;")),
    "wg2.load_q": ("pair", (PT, "load_q<T, WGMMA_ROWS, 128>(p, sg.b, row0, sQ, wtid)")),
    "wg2.v_free": ("pair", (PT, "mbar_wait(v_free + 8 * st, (vphases >> st) & 1)")),
    "wg2.arm": ("pair", (PT, "if (wtid == 0) mbar_expect_tx(k_remote + 8 * st, PAIR_HALF_BYTES)")),
    "wg2.store": ("pair", (PT, "st_shared_v4(dst + o, v)")),
    "wg2.st_async": ("pair", (PT, "st_async_v4(rdst + o, v, rbar)")),
    "wg2.publish": ("pair", (PT, "ld.publish(own, oc, valid + st * BN, flags + st * 8)")),
    "fp8.publish": ("fp8", ("struct Fp8RegLoader {", "if (q == 0) valid[tok0 + 32 * r]")),
    "wg2.q_wait": ("pair", (PT, "if (t == t0) cp_async_wait<0>();")),
    "wg2.k_full": ("pair", (PT, "bar_arrive(BAR_K_FULL + st, 256)")),
    "wg2.epi_wait": ("pair", (K, K2, "mbar_wait(epi_done, phase)")),
    "wg2.final": ("pair", (K, K2, "cluster_sync()")),
    "land": None,
}
S = protocol_sim.Sites(FILES, {k: None if v is None else (v[0], v[1], 0) for k, v in SITES.items()},
                       "(the cluster's network)")
locate_sites, MISSING_SITES, where, lineno = S.locate, S.missing, S.where, S.line


# ---------------------------------------------------------------------------------------------
# Constants of the kernel.
CTAS = 2  # PAIR_CTAS
THREADS = 384  # FP8_WG_THREADS
TILE_BYTES = 64 * 576 * 2  # 64 rows of 576 16-bit features
HALF_BYTES = 32 * (TILE_BYTES // 64)  # PAIR_HALF_BYTES
assert HALF_BYTES == 36864
RELEASES = 2 * 8  # PAIR_RELEASES
EPI = 2 * 256  # PAIR_EPI
K_FULL, P_FULL, P_FREE, EPI_WG1, EPI_WG0 = 1, 5, 6, 11, 12  # BAR_K_FULL (+ st), BAR_P_FULL, ...
BAR_NAMES = {0: "__syncthreads", 1: "K_FULL[0]", 2: "K_FULL[1]", 5: "P_FULL", 6: "P_FREE", 11: "EPI_WG1",
             12: "EPI_WG0", "cluster": "cluster_sync"}
# Actors of a CTA: name, weight in threads, warps (v_free arrivals), producer slice (rows of the round).
GROUPS = [("WG0", 128, 4, None), ("WG1", 128, 4, None), ("W2A", 32, 1, "w0"), ("W2B", 96, 3, "w123")]
assert sum(g[1] for g in GROUPS) == THREADS
SLICES = {"w0": 8, "w123": 24}  # rows of the CTA's 32 a slice's warps store
CHUNKS = 2  # st.async chunks per slice and tile (one per O column part: o0, o1)

# Injected bugs: name -> (what, sites). Expected to be caught by --self-test (with and without intent).
BUGS = {
    "no_v_free_wait": ("the producer does not wait on v_free[st] before storing tile t >= t0 + 2",
                       ["wg2.v_free"]),
    "local_release_only": ("the consumers' warps release only their own CTA's v_free (no mbar_arrive_cluster "
                           "on the peer's)", ["rel.peer"]),
    "arm_before_v_free": ("thread 0 arms k_remote[st] (expect_tx) before its v_free wait", ["wg2.arm", "wg2.v_free"]),
    "v_free_count_8": ("v_free initialized with 8 arrivals (one CTA's warps) instead of 16", ["init.v_free"]),
    "no_epi_wait": ("the producer does not wait on epi_done before the next segment", ["wg2.epi_wait"]),
    "epi_local_only": ("the consumers arrive only on their own CTA's epi_done, initialized with 256",
                       ["wg0.epi_peer", "wg1.epi_peer", "init"]),
    "no_k_remote_wait": ("warpgroup 0 does not wait on k_remote[st] (the peer's half) before S",
                         ["wg0.k_remote"]),
    "k_remote_phases_per_segment": ("PairStages (and its k_remote parity bits) made per segment, inside the "
                                    "segment loop", ["wg0.phases"]),
    "vphases_per_segment": ("the producer's v_free parity bits reset per segment", ["wg2.vphases"]),
    "release_last_tiles": ("the consumers release the stage after every tile (also the last two of a "
                           "segment)", ["wg0.release", "wg1.release"]),
    "short_tx": ("expect_tx arms 32 bytes fewer than the peer sends", ["wg2.arm"]),
    "no_init_cluster_sync": ("__syncthreads instead of the cluster_sync after the mbarrier init (the peer may "
                             "reach a barrier before it is initialized)", ["init.sync"]),
    "exit_early": ("no final cluster_sync, and the producer skips the last segment's epi_done wait (a CTA "
                   "may exit while the peer still arrives on its epi_done)",
                   ["wg0.final", "wg1.final", "wg2.final", "wg2.epi_wait"]),
}
# Removals the model finds no violation for (shown by --self-test as information, not advice).
ABLATIONS = {
    "no_final_cluster_sync": ("drop the final cluster_sync (every remote operation into a CTA is awaited there "
                              "before its threads can finish: k_remote, v_free, epi_done; the model does not "
                              "check other DSMEM rules)", ["wg0.final", "wg1.final", "wg2.final"]),
    "skip_last_epi_wait": ("the producer skips the last segment's epi_done wait (safe only because of the "
                           "final cluster_sync: with both, see exit_early)", ["wg2.epi_wait"]),
}


# ---------------------------------------------------------------------------------------------
def tagstr(tag):
    if tag is None:
        return "nothing (never written)"
    if tag[0] == "tile":
        return f"tile (seg {tag[1]}, t {tag[2]})"
    if tag[0] == "O":
        return f"O of seg {tag[1]}"
    return f"seg {tag[1]}"


protocol_sim.bind(S, tagstr)


class Op:
    __slots__ = ("kind", "site", "bar", "parity", "meant", "n", "label", "reads", "cells", "tag", "cta", "nbytes",
                 "arrived", "gen", "blocked")

    def __init__(self, kind, site, **kw):
        self.kind, self.site = kind, site
        self.arrived = self.blocked = False
        for k, v in kw.items():
            setattr(self, k, v)

    def describe(self):
        k = self.kind
        if k == "mwait":
            return f"mbar_wait({self.bar.name}, parity {self.parity}) meaning phase {self.meant}"
        if k in ("marrive", "rarrive", "expect_tx"):
            what = {"marrive": "mbar_arrive", "rarrive": "mbar_arrive_cluster", "expect_tx": "mbar_expect_tx"}[k]
            return f"{what}({self.bar.name}, {self.n}) for phase {self.meant}"
        if k in ("barrive", "bsync"):
            s = "bar_sync" if k == "bsync" else "bar_arrive"
            lab = f" for {self.label}" if self.label is not None else ""
            return f"{s}({self.bar.name}, {self.n}){lab}" + (" [arrived, waiting]" if self.arrived else "")
        if k in ("rbegin", "rend"):
            return f"{'read' if k == 'rbegin' else 'end read'} " + ", ".join(
                f"{cellset(cs)} ({tagstr(t)})" for cs, t in self.reads)
        if k in ("wbegin", "wend"):
            return f"{'write' if k == 'wbegin' else 'end write'} {cellset(self.cells)} ({tagstr(self.tag)})"
        if k == "st_async":
            return f"st.async {self.cells[0]} of rank {self.cta} ({tagstr(self.tag)}, {self.nbytes} B) " \
                   f"completing on {self.bar.name} for phase {self.meant}"
        if k == "init":
            return "mbar_init (epi_done, k_remote[2], v_free[2])"
        return k


def cellset(cells):
    if len(cells) <= 2:
        return ", ".join(cells)
    pre = os.path.commonprefix(cells)
    return f"{pre}* ({len(cells)} cells)"


class Actor:
    def __init__(self, name, cta, weight, warps, slice_):
        self.base, self.cta, self.weight, self.warps, self.slice = name, cta, weight, warps, slice_
        self.name = f"{name}@{cta}"
        self.gen, self.op, self.ctx = None, None, ""
        self.remote = 0  # its remote arrivals in flight


class Cta:
    def __init__(self, rank, bugs, intent):
        self.rank = rank
        self.epi = MBar(f"epi_done@{rank}", 256 if "epi_local_only" in bugs else EPI, intent, False, rank)
        self.k_remote = [MBar(f"k_remote[{s}]@{rank}", 1, intent, False, rank) for s in range(2)]
        self.v_free = [MBar(f"v_free[{s}]@{rank}", 8 if "v_free_count_8" in bugs else RELEASES, intent, False, rank)
                       for s in range(2)]
        self.mbars = [self.epi] + self.k_remote + self.v_free
        self.nbars = {b: NamedBar(f"{BAR_NAMES[b]}@{rank}", intent) for b in (0, 1, 2, 5, 6, 11, 12)}
        self.cells = {}
        self.stage = []  # stage[s]: its cell names
        for s in range(2):
            names = [f"stage[{s}].half{h}.{p}.o{g}" for h in range(CTAS) for p in SLICES for g in range(2)]
            self.stage.append(names)
        for names in self.stage:
            for n in names:
                self.cells[n] = Part()
        for n in ["Q.w0", "Q.w123", "valid[0].w0", "valid[0].w123", "valid[1].w0", "valid[1].w123", "P",
                  "s_alpha", "s_fin"]:
            self.cells[n] = Part()
        self.exited = False
        self.done = 0


# ---------------------------------------------------------------------------------------------
class Sim:
    def __init__(self, segs, bugs, rng, intent=True):
        self.segs, self.bugs, self.rng, self.intent = segs, set(bugs), rng, intent
        self.ctas = [Cta(r, self.bugs, intent) for r in range(CTAS)]
        self.cluster = NamedBar("cluster_sync", intent)
        self.flight = []  # in the network: ("bytes", cta, cell, nbytes, tag, bar, meant, who) / ("arrive", ...)
        self.blocked_waits = collections.Counter()  # site -> waits that did not return at once
        self.events = collections.Counter()  # orders of interest the run went through (see EVENTS)
        self.trace = collections.deque(maxlen=400)
        self.actors = []
        for r in range(CTAS):
            for name, weight, warps, sl in GROUPS:
                a = Actor(name, r, weight, warps, sl)
                prog = {"WG0": self.prog_wg0, "WG1": self.prog_wg1}.get(name, self.prog_wg2)
                a.gen = prog(a)
                a.op = next(a.gen, None)
                self.actors.append(a)

    # Who must read a write, how often, before it may be overwritten (reader names of the cell's CTA).
    def readers(self, r, cell, tag):
        if cell.startswith("stage"):
            if tag[0] == "tile":
                return {f"WG0@{r}": 2, f"WG1@{r}": 1}  # S and P V / P V
            return {f"WG{cell[-1]}@{r}": 1}  # O staged: its warpgroup's copy_out
        if cell.startswith("Q"):
            t0, t1 = self.segs[tag[1]]
            return {f"WG0@{r}": t1 - t0}
        if cell.startswith("valid") or cell == "s_alpha":
            return {f"WG{0 if cell.startswith('valid') else 1}@{r}": 1}
        return {f"WG0@{r}": 1, f"WG1@{r}": 1}  # P, s_fin

    # -- memory ---------------------------------------------------------------------------------
    def wbegin(self, who, r, cells, tag, site):
        c = self.ctas[r]
        if c.exited:
            raise Violation("exit", f"{who} writes {cellset(cells)} of rank {r}, which has exited ({where(site)})")
        for name in cells:
            begin_write(c.cells[name], f"{name}@{r}", who, tag, self.readers(r, name, tag), site)

    def wend(self, r, cells):
        for name in cells:
            end_write(self.ctas[r].cells[name])

    def rbegin(self, who, r, reads, site):
        c = self.ctas[r]
        for cells, tag in reads:
            for name in cells:
                begin_read(c.cells[name], f"{name}@{r}", who, tag, site)

    def rend(self, who, r, reads, site):
        c = self.ctas[r]
        for cells, tag in reads:
            for name in cells:
                p = c.cells[name]
                if p.tag != tag or p.writing is not None:  # (a write start would have been caught)
                    raise Violation("race", f"{who}'s read of {name}@{r} ({tagstr(tag)}) saw it change ({where(site)})")
                end_read(p, who)

    # -- program pieces -------------------------------------------------------------------------
    def read(self, reads, site):
        yield Op("rbegin", site, reads=reads)
        yield Op("rend", site, reads=reads)

    def write(self, cells, tag, site):
        yield Op("wbegin", site, cells=cells, tag=tag)
        yield Op("wend", site, cells=cells, tag=tag)

    def start(self, me):
        c = self.ctas[me.cta]
        me.ctx = "prologue"
        if me.base == "WG0":  # thread 0
            yield Op("init", "init")
        if "no_init_cluster_sync" in self.bugs:
            yield Op("bsync", "init.sync", bar=c.nbars[0], n=THREADS, label="init")
        else:
            yield Op("bsync", "init.sync", bar=self.cluster, n=CTAS * THREADS, label="init")

    def finish(self, me, site):
        me.ctx = "end"
        if "no_final_cluster_sync" not in self.bugs and "exit_early" not in self.bugs:
            yield Op("bsync", site, bar=self.cluster, n=CTAS * THREADS, label="final")
        me.ctx = "exited"

    def release(self, me, st, j, site):
        """pair_release of stage st (the j-th release of the stage): the actor's warps on both CTAs."""
        c, peer = self.ctas[me.cta], self.ctas[me.cta ^ 1]
        ctx = me.ctx
        me.ctx = f"{ctx} ({lineno(site)})"
        yield Op("marrive", "rel.local", bar=c.v_free[st], n=me.warps, meant=j)
        if "local_release_only" not in self.bugs:
            yield Op("rarrive", "rel.peer", bar=peer.v_free[st], n=me.warps, meant=j)
        me.ctx = ctx

    def epilogue(self, me, k, g):
        """stage_and_store (O columns of warpgroup g over the stages), copy_out, the epi_done arrivals."""
        c, peer = self.ctas[me.cta], self.ctas[me.cta ^ 1]
        ocells = [n for st in c.stage for n in st if n.endswith(f".o{g}")]
        yield Op("wbegin", f"wg{g}.stage", cells=ocells, tag=("O", k))
        yield Op("wend", "stage.write", cells=ocells, tag=("O", k))
        yield from self.read([(ocells, ("O", k)), (["s_fin"], ("seg", k))], "copy_out")
        yield Op("marrive", f"wg{g}.epi_local", bar=c.epi, n=me.weight, meant=k)
        if "epi_local_only" not in self.bugs:
            yield Op("rarrive", f"wg{g}.epi_peer", bar=peer.epi, n=me.weight, meant=k)

    # -- programs ---------------------------------------------------------------------------------
    def prog_wg0(self, me):
        B = self.bugs
        c = self.ctas[me.cta]
        yield from self.start(me)
        phases = 0  # PairStages::phases
        waited = [0, 0]  # k_remote phases waited, per stage (the meant phase)
        rel = [0, 0]  # releases per stage
        for k, (t0, t1) in enumerate(self.segs):
            if "k_remote_phases_per_segment" in B:
                phases = 0
            for t in range(t0, t1):
                st = (t - t0) & 1
                tile = ("tile", k, t)
                me.ctx = f"seg {k} tile {t} st {st}"
                yield Op("bsync", "wg0.k_full", bar=c.nbars[K_FULL + st], n=256, label=("K_FULL", k, t))
                if "no_k_remote_wait" not in B:
                    yield Op("mwait", "wg0.k_remote", bar=c.k_remote[st], parity=(phases >> st) & 1,
                             meant=waited[st])
                phases ^= 1 << st
                waited[st] += 1
                yield from self.read([(c.stage[st], tile), (["Q.w0", "Q.w123"], ("seg", k))], "wg0.qk")
                yield from self.read([([f"valid[{st}].w0", f"valid[{st}].w123"], tile)], "wg0.softmax")
                yield Op("bsync", "wg0.p_free", bar=c.nbars[P_FREE], n=256, label=("P_FREE", k, t))
                yield from self.write(["P"], tile, "wg0.p")
                yield from self.write(["s_alpha"], tile, "wg0.alpha")
                yield Op("barrive", "wg0.p_full", bar=c.nbars[P_FULL], n=256, label=("P_FULL", k, t))
                yield from self.read([(["P"], tile), (c.stage[st], tile)], "wg0.pv")
                if t + 2 < t1 or "release_last_tiles" in B:
                    yield from self.release(me, st, rel[st], "wg0.release")
                    rel[st] += 1
            me.ctx = f"seg {k} epilogue"
            yield from self.write(["s_fin"], ("seg", k), "wg0.fin")
            yield Op("barrive", "wg0.epi_arrive", bar=c.nbars[EPI_WG0], n=256, label=("EPI_WG0", k))
            yield Op("bsync", "wg0.epi_sync", bar=c.nbars[EPI_WG1], n=256, label=("EPI_WG1", k))
            yield from self.epilogue(me, k, 0)
        yield from self.finish(me, "wg0.final")

    def prog_wg1(self, me):
        B = self.bugs
        c = self.ctas[me.cta]
        yield from self.start(me)
        rel = [0, 0]
        for k, (t0, t1) in enumerate(self.segs):
            me.ctx = f"seg {k}"
            yield Op("barrive", "wg1.p_free0", bar=c.nbars[P_FREE], n=256, label=("P_FREE", k, t0))
            for t in range(t0, t1):
                st = (t - t0) & 1
                tile = ("tile", k, t)
                me.ctx = f"seg {k} tile {t} st {st}"
                yield Op("bsync", "wg1.p_full", bar=c.nbars[P_FULL], n=256, label=("P_FULL", k, t))
                yield from self.read([(["s_alpha"], tile)], "wg1.alpha")
                yield from self.read([(["P"], tile), (c.stage[st], tile)], "wg1.pv")
                if t + 1 < t1:
                    yield Op("barrive", "wg1.p_free", bar=c.nbars[P_FREE], n=256, label=("P_FREE", k, t + 1))
                if t + 2 < t1 or "release_last_tiles" in B:
                    yield from self.release(me, st, rel[st], "wg1.release")
                    rel[st] += 1
            me.ctx = f"seg {k} epilogue"
            yield Op("barrive", "wg1.epi_arrive", bar=c.nbars[EPI_WG1], n=256, label=("EPI_WG1", k))
            yield Op("bsync", "wg1.epi_sync", bar=c.nbars[EPI_WG0], n=256, label=("EPI_WG0", k))
            yield from self.epilogue(me, k, 1)
        yield from self.finish(me, "wg1.final")

    def prog_wg2(self, me):
        """W2A (warp 0: thread 0 arms k_remote) or W2B (warps 1..3): pair_producer_tiles + the epi_done wait."""
        B = self.bugs
        r = me.cta
        c, peer = self.ctas[r], self.ctas[r ^ 1]
        arms = me.slice == "w0"
        sl = me.slice
        yield from self.start(me)
        vphases = 0
        vwaits = [0, 0]  # v_free phases waited, per stage
        ntile = [0, 0]  # tiles stored per stage: the k_remote phase they complete (in both CTAs)
        phase = 0
        chunk_bytes = SLICES[sl] * (TILE_BYTES // 64) // CHUNKS
        last = len(self.segs) - 1
        for k, (t0, t1) in enumerate(self.segs):
            if "vphases_per_segment" in B:
                vphases = 0
            me.ctx = f"seg {k}"
            qcell = [f"Q.{sl}"]
            yield Op("wbegin", "wg2.load_q", cells=qcell, tag=("seg", k))
            for t in range(t0, t1):
                st = (t - t0) & 1
                tile = ("tile", k, t)
                me.ctx = f"seg {k} tile {t} st {st}"
                m = ntile[st]
                arm = None
                if arms:
                    nbytes = HALF_BYTES - (32 if "short_tx" in B else 0)
                    arm = Op("expect_tx", "wg2.arm", bar=c.k_remote[st], n=nbytes, nbytes=nbytes, meant=m)
                    if "arm_before_v_free" in B:
                        yield arm
                if t >= t0 + 2:
                    if "no_v_free_wait" not in B:
                        yield Op("mwait", "wg2.v_free", bar=c.v_free[st], parity=(vphases >> st) & 1,
                                 meant=vwaits[st])
                    vphases ^= 1 << st
                    vwaits[st] += 1
                if arm is not None and "arm_before_v_free" not in B:
                    yield arm
                own = [n for n in c.stage[st] if f".half{r}.{sl}." in n]
                yield Op("wbegin", "wg2.store", cells=own, tag=tile)
                for g in range(CHUNKS):
                    yield Op("st_async", "wg2.st_async", cta=r ^ 1, cells=[f"stage[{st}].half{r}.{sl}.o{g}"],
                             nbytes=chunk_bytes, tag=tile, bar=peer.k_remote[st], meant=m)
                yield Op("wend", "wg2.store", cells=own, tag=tile)
                ntile[st] += 1
                yield from self.write([f"valid[{st}].{sl}"], tile, "wg2.publish")
                if t == t0:
                    yield Op("wend", "wg2.q_wait", cells=qcell, tag=("seg", k))
                yield Op("barrive", "wg2.k_full", bar=c.nbars[K_FULL + st], n=256, label=("K_FULL", k, t))
            me.ctx = f"seg {k} end"
            skip = "no_epi_wait" in B or (k == last and ("exit_early" in B or "skip_last_epi_wait" in B))
            if not skip:
                yield Op("mwait", "wg2.epi_wait", bar=c.epi, parity=phase, meant=k)
            phase ^= 1
        yield from self.finish(me, "wg2.final")

    # -- scheduling -------------------------------------------------------------------------
    def enabled(self, a):
        op = a.op
        if op.kind == "mwait":
            return op.bar.init and (op.bar.phase & 1) != op.parity
        if op.kind == "bsync":
            if not op.arrived:  # barrier.cluster.arrive.release: the actor's remote arrivals are performed first
                return op.bar is not self.cluster or not a.remote
            return op.bar.gen > op.gen
        return True

    def step(self, a):
        op = a.op
        k = op.kind
        record_step(op, self.trace, self.blocked_waits, a.name, a.ctx)
        who = f"{a.name} ({a.ctx})"
        advance = True
        if k == "init":
            for mb in self.ctas[a.cta].mbars:
                mb.init = True
        elif k == "mwait":
            op.bar.check_init(who, op.site)
            check_wait(op, who, self.intent)
        elif k == "marrive":
            op.bar.arrive(op.n, op.meant, who, op.site)
        elif k == "expect_tx":
            before = (op.bar.tx, op.bar.phase)
            op.bar.expect_tx(op.nbytes, op.meant, who, op.site)
            if before[0] < 0:
                self.events["arm_late"] += 1
                if op.bar.phase > before[1]:
                    self.events["arm_last"] += 1
        elif k == "rarrive":
            if self.ctas[op.bar.cta].exited:
                raise Violation("exit", f"{who} arrives on {op.bar.name}: rank {op.bar.cta} has exited "
                                f"({where(op.site)})")
            self.flight.append(("arrive", op.bar, op.n, op.meant, who, op.site, a))
            a.remote += 1
        elif k == "st_async":
            self.wbegin(who, op.cta, op.cells, op.tag, op.site)
            self.flight.append(("bytes", op.cta, op.cells, op.nbytes, op.tag, op.bar, op.meant, who, op.site))
        elif k == "barrive":
            op.bar.arrive(op.n, a.weight, op.label, who, op.site)
        elif k == "bsync":
            if not op.arrived:
                op.gen = op.bar.arrive(op.n, a.weight, op.label, who, op.site)
                op.arrived = True
                advance = False
        elif k == "rbegin":
            self.rbegin(a.name, a.cta, op.reads, op.site)
        elif k == "rend":
            self.rend(a.name, a.cta, op.reads, op.site)
        elif k == "wbegin":
            self.wbegin(a.name, a.cta, op.cells, op.tag, op.site)
        elif k == "wend":
            self.wend(a.cta, op.cells)
        if advance:
            a.op = next(a.gen, None)
            if a.op is None:
                c = self.ctas[a.cta]
                c.done += 1
                if c.done == len(GROUPS):
                    c.exited = True
                    self.trace.append((f"CTA{a.cta}", "", "land", f"rank {a.cta}: all threads exited"))

    def land(self, i):
        item = self.flight.pop(i)
        if item[0] == "arrive":
            _, bar, n, meant, who, site, issuer = item
            issuer.remote -= 1
            what = f"{who}'s remote arrival ({n}) on {bar.name} for phase {meant}"
            self.trace.append(("NET", "", "land", f"{what} lands"))
            if self.ctas[bar.cta].exited:
                raise Violation("exit", f"{what} lands in rank {bar.cta}, which has exited ({where(site)})")
            before = bar.phase
            bar.arrive(n, meant, what, site)
            if bar.phase > before:
                self.events["remote_last_epi" if bar.name.startswith("epi") else "remote_last_vfree"] += 1
        else:
            _, r, cells, nbytes, tag, bar, meant, who, site = item
            what = f"{who}'s st.async of {tagstr(tag)} into {cells[0]}@{r} ({nbytes} B)"
            self.trace.append(("NET", "", "land", f"{what} lands"))
            if self.ctas[r].exited:
                raise Violation("exit", f"{what} lands in rank {r}, which has exited ({where(site)})")
            self.wend(r, cells)
            before = bar.phase
            bar.complete_tx(nbytes, meant, what, site)
            if bar.phase > before:
                self.events["bytes_last"] += 1

    def engine(self):
        return self.flight

    def engine_step(self, ev, i):
        self.land(i)

    def final_checks(self):
        end_checks([mb for c in self.ctas for mb in c.mbars],
                   [self.cluster] + [nb for c in self.ctas for nb in c.nbars.values()],
                   [(f"{name}@{c.rank}", p) for c in self.ctas for name, p in c.cells.items()])

    def state(self):
        out = actor_lines(self, 6)
        for c in self.ctas:
            out.append(f"  rank {c.rank}{' (exited)' if c.exited else ''} mbarriers: "
                       + "; ".join(str(m) for m in c.mbars))
            out.append(f"  rank {c.rank} named barriers: "
                       + ("; ".join(str(n) for n in c.nbars.values() if n.count is not None) or "no arrivals pending"))
        out.append(f"  {self.cluster}")
        fl = []
        for it in self.flight:
            if it[0] == "arrive":
                fl.append(f"arrival on {it[1].name} ({it[2]}, phase {it[3]})")
            else:
                fl.append(f"st.async {it[2][0]}@{it[1]} ({tagstr(it[4])}, phase {it[6]})")
        out.append("  in flight: " + (", ".join(fl) or "nothing"))
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------
FIXED_CASES = fixed_cases(10, 6, 17)


def explore(runs, seed, bugs, fixed_segs=None, only_run=None, ntrace=12, quiet=False, max_reports=3, intent=True,
            stop_after=None):
    """The random runs (protocol_sim.explore's statistics) and, unless quiet, the orders they went through."""
    stats = explore_segments(runs, seed, bugs, fixed_segs, only_run, ntrace, quiet, max_reports, stop_after,
                             FIXED_CASES, lambda rng: random_segments(rng, 12, 14),
                             lambda segs, rng: run_once(Sim(segs, bugs, rng, intent), rng, 400000),
                             "" if intent else "--no-intent-checks ", (6, 38, 18))
    if not quiet:
        print("\norders the runs went through (counts over all runs, both ranks):")
        for key, what in EVENTS.items():
            print(f"  {stats['events'][key]:7d}  {what}")
    return stats


def self_test(seed, runs_per_bug):
    return protocol_sim.self_test(explore, BUGS, ABLATIONS, seed, runs_per_bug, 28, 1000, stop_after=20,
                                  plain_checks="the data tags, exits and deadlocks")


EVENTS = {
    "arm_late": "thread 0 armed k_remote[st] after some of the peer's st.async bytes of the phase had landed (tx < 0)",
    "arm_last": "... after all of them: the arming completed the phase",
    "bytes_last": "the peer's last st.async bytes completed a k_remote phase (after the arming)",
    "remote_last_vfree": "the peer's remote arrival was the last one of a v_free phase",
    "remote_last_epi": "the peer's remote arrival was the last one of an epi_done phase",
}
WAITS = ("init.sync", "wg0.k_full", "wg0.k_remote", "wg0.p_free", "wg0.epi_sync", "wg1.p_full", "wg1.epi_sync",
         "wg2.v_free", "wg2.epi_wait", "wg0.final", "wg1.final", "wg2.final")


def main():
    return protocol_cli.main(__doc__, KERNEL, locate_sites, MISSING_SITES, BUGS, ABLATIONS, where, self_test,
                             explore, WAITS)


if __name__ == "__main__":
    run(main)
