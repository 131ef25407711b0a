#!/usr/bin/env python3
"""Executable model of the synchronization protocol of the sparse MLA prefill kernel `prefill_sm90`
(kernels-cuda/sparse_mla_attention/prefill_sm90.cuh, with the seesaw helpers of
kernels-cuda/mla_decode_attention/wgmma_seesaw_sm90.cuh), explored over random interleavings to find
deadlocks, barrier-phase mistakes and shared-memory races before the kernel runs on a GPU. Standard
library only (Python 3.11); the conventions of tools/models/fp8raw_protocol.py and
tools/models/gather3wg_protocol.py; the machinery of protocol_sim.py (barriers, race bookkeeping, scheduler,
reports, self-test) and the command line of protocol_cli.py.

What it models
  One CTA (one query token, 64 heads) over its whole topk: tiles = ceil(topk / 64) in pairs (A, B) =
  (2 k, 2 k + 1); the last pair has no B when the tile count is odd.
  Actors, generators that step through the code one synchronization or shared-memory access at a time (a
  step is atomic):
    WG0  warpgroup 0: q_full; S(A) of pair 0 (pf_qk over L then R, wgmma_wait<0>); per pair vfull[0],
         the flags (pf_mask_max), m_A into s_m[A] (ss_softmax_a), bar_arrive(SCALE0), P_A V over buffer
         0's L (pv_local), wgmma_wait<0>, arrive free[0][0], bar_sync(SCALE1), m_B from s_m[B]
         (ss_hand_p0), P0 into block
         8 of buffer 0, bar_arrive(P0_READY); with B: full[1][0], bar_sync(RO1), P1 V over buffer 1's L
         (pv_remote); with a next pair: S(A') L (full[0][0]); with B: wgmma_wait<1> / <0>, arrive
         free[1][0]; S(A') R (full[0][1]); wgmma_wait<0>. Then ss_row_sums over s_l (its s_fin):
         bar_sync(LSUM), WG1's sums read from s_l[1], the totals written to s_l[0], the final maxima to
         s_l[1]; bar_arrive(PF_FIN), bar_sync(BAR_WG0), pf_store.
    WG1  warpgroup 1: q_full; S(B) of pair 0 (R then L) when tiles > 1; per pair (with B) vfull[1] and
         the flags, bar_sync(SCALE0), m_A read, m_B written (ss_softmax_b), bar_arrive(SCALE1); with B: P1
         written,
         P_B V over buffer 1's R (pv_local); bar_sync(P0_READY), full[0][1], P0 V over buffer 0's R
         (ss_pv_p0, P0 read from block 8); with B: bar_arrive(RO1), wgmma_wait<1>, arrive free[1][1];
         wgmma_wait<0>, arrive free[0][1]; with a next B: S(B') R, L, wgmma_wait<0>. Then ss_row_sums:
         its sums into s_l[1], bar_arrive(LSUM); bar_sync(PF_FIN), pf_store.
    pf_store (both): the totals read (s_l[0]), the warpgroup's O columns staged over buffer 0,
         bar_sync(BAR_WG0 / BAR_WG1), the staged columns read back (the copy out); WG0 also reads the
         totals and the final maxima (s_l[1]) for lse.
    WG2  the producer warpgroup: Q by cp.async, the noinc arrival on q_full; per pair A.L, B.R, A.R,
         B.L: each after its free[b][h] wait (from the second pair on); before the first half of a
         buffer the 16 group leads' token flags (valid[b]) and their arrival on vfull[b] (count 16);
         the half's copies, then cp.async.mbarrier.arrive.noinc on full[b][h]; cp_async_wait<0> at the
         end.
    CE   the copy engine: the producer's copies are batches, one per (half, thread set): the 128 threads
         are COPY_SETS sets of 128 / COPY_SETS threads; a batch lands at a random later step, in any
         order across halves and sets. A set's noinc arrival (its threads' arrivals, 128 / COPY_SETS of
         the 128 the barrier counts) lands at a random step after every copy that set issued before it
         has landed (PTX: the arrive-on is triggered by the completion of all prior cp.async of the
         executing thread; .noinc: it counts against the init count).
  mbarriers as in PTX: a pending count per phase; the phase completes when it reaches 0 (the parity
  flips, the count is reset); arrivals beyond a phase's count go to the next one; try_wait.parity P
  returns once the current parity != P. q_full, full[b][h], free[b][h] (count 128), vfull[b] (16).
  Named barriers SCALE0 (1), SCALE1 (2), P0_READY (3), RO1 (4), LSUM (6), BAR_WG0 (7), PF_FIN (8),
  BAR_WG1 (10): bar.arrive / bar.sync add the warpgroup's 128 threads; an instance completes at its
  count (256; BAR_WG0 / BAR_WG1 128); bar.sync waits for the instance it arrived on.
  wgmma commit groups: each pf_qk, pv_local, pv_remote is one group whose shared-memory reads (Q, the
  K / V half or halves, P0 / P1 as the A operand) stay open from its issue until the wgmma_wait<N>
  that leaves at most N groups of the warpgroup pending (groups complete in order: wait<1> leaves the
  last one open).
  Shared memory, buffers of parts, every write tagged and listing who must read it how often before
  it may be overwritten (readers()):
    Q[L, R]            the producer's copies; S of every tile reads both.
    buf0[L, R, R8]     buffer 0 (tile A): L = blocks 0-3 (dims 0-255, WG0's V columns), R = blocks 4-7
                       (WG1's V columns), R8 = block 8 (the rope's last block), which also holds P0
                       (WG0 writes it after S(A), WG1's P0 V reads it). Each part is split in two by
                       the columns of the final O staging (/0: WG0's columns 0-255 of each staged row,
                       /1: WG1's 256-511): the staging rows (1040 bytes) cross all nine blocks, so each
                       warpgroup's staging writes its half of every part; the copies, S, P V and P0
                       cover both.
    buf1[L, R, R8]     buffer 1 (tile B).
    valid[0], valid[1] the token flags (the producer's group leads); P1 (WG1); s_m[A] (m_A: WG0),
                       s_m[B] (m_B: WG1); s_l[0] (the totals: WG0), s_l[1] (WG1's row sums, then the
                       final maxima: WG0).
Checks (a run stops at its first violation)
  race      a write while a read or another write of the part is open, or before a reader read the
            previous contents as often as it must; a read that finds a write in progress or another
            tag (pair, tile) than expected; contents never read at the end.
  named     two instances (SCALE0 of pair k, ...) pending on one id, two counts on one instance,
            arrivals beyond the count, an instance left incomplete at the end.
  mbarrier  a wait that returns before the phase it means has completed (its parity matched an older
            phase); an arrival (a noinc one when it lands) counted in another phase than the one meant;
            a phase left half-done at the end.
  deadlock  no actor can step and nothing is in flight: each actor's blocking op with its kernel line.
  The instance and meant-phase checks are the intent checks (--no-intent-checks keeps only the
  PTX-level rules, the tags and deadlocks; --self-test runs both ways). Each step's kernel line is found
  by a chain of code snippets (SITES); a snippet no longer found is reported (the model may be out of
  date) and fails --self-test.
What it does not model
  Races inside a warpgroup (its warps in step: BAR_WG0 / BAR_WG1 are modelled but cannot matter;
  per-thread addresses, swizzles, the group leads' 4 flags each); the memory model beyond ordering by
  barriers: proxy fences (fence.proxy.async between the generic-proxy writes, cp.async and st.shared,
  and the wgmma reads of the async proxy; note: the kernel fences after its P0 / P1 stores but not
  between its full[b][h] / q_full waits and the wgmma that read what cp.async wrote, where the gather
  form of wgmma_3wg_sm90.cuh fences after its FULL wait, docs/perf.md), scopes, the mbarrier init (__syncthreads taken as done),
  setmaxnreg; register hazards of wgmma (pin); values (softmax, masking, indices: the index requests
  and `usable` are global reads, not steps); the global epilogue's writes (out, lse) beyond their
  shared-memory reads; lse is taken as requested (p.lse != nullptr). Timing: paces are random per run,
  not exhaustive; a finding comes with the seed and run to replay; the normal mode prints how often
  each wait had to wait.
How to run
  python3 tools/models/sparse_prefill_protocol.py                 # 2000 random runs, seed 1
  python3 tools/models/sparse_prefill_protocol.py --runs 5000 --seed 7
  python3 tools/models/sparse_prefill_protocol.py --segments 3,4  # tile counts, run i takes the
                                                                   # (i mod n)-th (one CTA, one token)
  python3 tools/models/sparse_prefill_protocol.py --bug no_free_wait    # inject bugs (see --list-bugs)
  python3 tools/models/sparse_prefill_protocol.py --self-test     # each bug caught, the kernel clean
  python3 tools/models/sparse_prefill_protocol.py --run 17 --trace 60   # replay run 17 of the seed
  python3 tools/models/sparse_prefill_protocol.py --no-intent-checks    # PTX-level + data checks only
Exit status 0 when clean (--self-test: every bug caught both ways, the protocol clean), else 1.
"""

import collections
import random

import protocol_cli
import protocol_sim
from protocol_cli import run
from protocol_sim import (MBar, NamedBar, Part, SimBase, Violation, actor_lines, barrier_lines, begin_read, begin_write,
                          check_wait, end_checks, end_read, end_write, print_report, record_step, run_once)

KERNEL = "kernels-cuda/sparse_mla_attention/prefill_sm90.cuh"
FILES = {"": KERNEL, "@ss": "kernels-cuda/mla_decode_attention/wgmma_seesaw_sm90.cuh"}

# Kernel lines: per modelled step a chain of snippets, each searched from the line of the one before; the
# last one is the step's line. A chain starting with "@ss" is searched in the seesaw header.
K = "template <typename T> __device__ void prefill_sm90("
PR = "if (wg == 2) {"  # the producer's branch
W0 = "if (wg == 0) {"  # warpgroup 0's branch
W1P = "if (tiles > 1) {"  # warpgroup 1's prologue
W1 = "has_b2 = 2 * k + 3 < tiles"  # warpgroup 1's loop
END = "ss_row_sums<PF_ROWS>(l, m_run, s_l, wg, r_lo, qd)"  # the end: the row sums, the stores
RS = "__device__ __forceinline__ void ss_row_sums("  # (seesaw header)
SA = "__device__ __forceinline__ void ss_softmax_a("  # the seesaw header's consumer steps
HP = "__device__ __forceinline__ void ss_hand_p0("
SB = "__device__ __forceinline__ void ss_softmax_b("
PP = "__device__ __forceinline__ void ss_pv_p0("
GA = "template <typename T> struct PrefillGather {"
QK = "__device__ __forceinline__ void pf_qk("
PS = "__device__ __forceinline__ void pf_store("
SITES = {
    "init.full": (K, "mbar_init(bars.full(b, h), 128)"),
    "init.free": (K, "mbar_init(bars.free_(b, h), 128)"),
    "init.vfull": (K, "mbar_init(bars.vfull(b), 16)"),
    "noinc": ("__device__ __forceinline__ void mbar_arrive_cp_async_noinc(", "cp.async.mbarrier.arrive.noinc"),
    "gather.copy": (GA, "cp_async16_hint(dst + cb * SUB_BYTES + swz(r, lane8)"),
    "gather.flags": (GA, "valid[4 * g + i] = sl[i] >= 0 ? 1 : 0"),
    "gather.vfull": (GA, "mbar_arrive(vbar)"),
    "qk.wait": (QK, "mbar_wait(bar, parity)"),
    "qk.commit": (QK, "wgmma_commit();"),
    "ss.pv_local": ("@ss", "__device__ __forceinline__ void pv_local(", "wgmma_commit();"),
    "ss.pv_remote": ("@ss", "__device__ __forceinline__ void pv_remote(", "wgmma_commit();"),
    "pr.q": (K, PR, "cp_async16(sQ + (c >> 3) * SUB_BYTES + swz(r, c & 7)"),
    "pr.q_full": (K, PR, "mbar_arrive_cp_async_noinc(bars.q_full())"),
    "pr.free00": (K, PR, "if (k > 0) mbar_wait(bars.free_(0, 0), par)"),
    "pr.flags0": (K, PR, "ga.publish(valid, sa, bars.vfull(0))"),
    "pr.copy_al": (K, PR, "ga.template copy<0, 4>(st0, sa)"),
    "pr.full00": (K, PR, "mbar_arrive_cp_async_noinc(bars.full(0, 0))"),
    "pr.free11": (K, PR, "if (k > 0) mbar_wait(bars.free_(1, 1), par)"),
    "pr.flags1": (K, PR, "ga.publish(valid + BN, sb, bars.vfull(1))"),
    "pr.copy_br": (K, PR, "ga.template copy<4, NSUB>(st1, sb)"),
    "pr.full11": (K, PR, "mbar_arrive_cp_async_noinc(bars.full(1, 1))"),
    "pr.free01": (K, PR, "if (k > 0) mbar_wait(bars.free_(0, 1), par)"),
    "pr.copy_ar": (K, PR, "ga.template copy<4, NSUB>(st0, sa)"),
    "pr.full01": (K, PR, "mbar_arrive_cp_async_noinc(bars.full(0, 1))"),
    "pr.free10": (K, PR, "if (k > 0) mbar_wait(bars.free_(1, 0), par)"),
    "pr.copy_bl": (K, PR, "ga.template copy<0, 4>(st1, sb)"),
    "pr.full10": (K, PR, "mbar_arrive_cp_async_noinc(bars.full(1, 0))"),
    "pr.cpwait": (K, PR, "cp_async_wait<0>();"),
    "c.q_full": (K, "mbar_wait(bars.q_full(), 0)"),
    "wg0.sa_l0": (K, W0, "pf_qk<T, 0, 4>(s, dq, st0, true, bars.full(0, 0), 0)"),
    "wg0.sa_r0": (K, W0, "pf_qk<T, 4, NSUB>(s, dq, st0, false, bars.full(0, 1), 0)"),
    "wg0.sa_wait0": (K, W0, "wgmma_wait<0>();"),
    "wg0.vfull": (K, W0, "mbar_wait(bars.vfull(0), par)"),
    "wg0.mask": (K, W0, "pf_mask_max(s, mx, valid, qd)"),
    "wg0.m_a": (K, W0, "ss_softmax_a<T>(s, pk, o, mx, bs, m_run, l, c, s_m, r_lo, qd)"),
    "ss.m_a": ("@ss", SA, "if (qd == 0) s_m[r_lo + 8 * hi] = m_run[hi]"),
    "wg0.scale0": ("@ss", SA, "bar_arrive(SS_SCALE0, 256)"),
    "wg0.pv_local": (K, W0, "pv_local<T>(o, pk, st0)"),
    "wg0.pv_wait": (K, W0, "pv_local<T>(o, pk, st0)", "wgmma_wait<0>();"),
    "wg0.free00": (K, W0, "mbar_arrive(bars.free_(0, 0))"),
    "wg0.scale1": (K, W0, "bar_sync(SS_SCALE1, 256)"),
    "wg0.m_b": (K, W0, "ss_hand_p0<T, PF_ROWS>(s, pk, o, m_run, l, a1, s_m, sP0, r_lo, wwarp, lane)"),
    "ss.m_b": ("@ss", HP, "const float mb = s_m[MT + r_lo + 8 * hi]"),
    "wg0.p0": ("@ss", HP, "store_p_rows(sP0, pk, wwarp, lane)"),
    "wg0.p0_ready": ("@ss", HP, "bar_arrive(SS_P0_READY, 256)"),
    "wg0.full10": (K, W0, "mbar_wait(bars.full(1, 0), par)"),
    "wg0.ro1": (K, W0, "bar_sync(SS_RO1, 256)"),
    "wg0.pv_remote": (K, W0, "pv_remote<T>(o, sP1, st1)"),
    "wg0.sa_l": (K, W0, "if (has_a2) pf_qk<T, 0, 4>(s, dq, st0, true, bars.full(0, 0), par ^ 1)"),
    "wg0.wait1": (K, W0, "wgmma_wait<1>();"),
    "wg0.wait0b": (K, W0, "wgmma_wait<1>();", "wgmma_wait<0>();"),
    "wg0.free10": (K, W0, "mbar_arrive(bars.free_(1, 0))"),
    "wg0.sa_r": (K, W0, "if (has_a2) pf_qk<T, 4, NSUB>(s, dq, st0, false, bars.full(0, 1), par ^ 1)"),
    "wg0.wait_end": (K, W0, "if (has_a2) pf_qk<T, 4, NSUB>", "wgmma_wait<0>();"),
    "wg1.sb_r0": (K, W0, W1P, "pf_qk<T, 4, NSUB>(s, dq, st1, true, bars.full(1, 1), 0)"),
    "wg1.sb_l0": (K, W0, W1P, "pf_qk<T, 0, 4>(s, dq, st1, false, bars.full(1, 0), 0)"),
    "wg1.sb_wait0": (K, W0, W1P, "wgmma_wait<0>();"),
    "wg1.vfull": (K, W1, "mbar_wait(bars.vfull(1), par)"),
    "wg1.mask": (K, W1, "pf_mask_max(s, mx, valid + BN, qd)"),
    "wg1.scale0": ("@ss", SB, "bar_sync(SS_SCALE0, 256)"),
    "wg1.m_a": (K, W1, "ss_softmax_b<T, PF_ROWS>(s, pk, o, mx, bs, a, m_run, l, c, s_m, sP1, has_b"),
    "wg1.m_b": (K, W1, "ss_softmax_b<T, PF_ROWS>(s, pk, o, mx, bs, a, m_run, l, c, s_m, sP1, has_b"),
    "ss.max_b": ("@ss", SB, "if (qd == 0) s_m[MT + r_lo + 8 * hi] = mn"),
    "wg1.scale1": ("@ss", SB, "bar_arrive(SS_SCALE1, 256)"),
    "wg1.p1": ("@ss", SB, "store_p_rows(sP1, pk, wwarp, lane)"),
    "wg1.pv_local": (K, W1, "pv_local<T>(o, pk, st1 + v_half)"),
    "wg1.p0_ready": ("@ss", PP, "bar_sync(SS_P0_READY, 256)"),
    "wg1.full01": (K, W1, "mbar_wait(full01, par)"),
    "wg1.pv_remote": ("@ss", PP, "pv_remote<T>(o, sP0, v)"),
    "wg1.ro1": ("@ss", PP, "bar_arrive(SS_RO1, 256)"),
    "wg1.wait1": (K, W1, "wgmma_wait<1>();"),
    "wg1.free11": (K, W1, "mbar_arrive(bars.free_(1, 1))"),
    "wg1.wait0": (K, W1, "mbar_arrive(bars.free_(1, 1))", "wgmma_wait<0>();"),
    "wg1.free01": (K, W1, "mbar_arrive(bars.free_(0, 1))"),
    "wg1.sb_r": (K, W1, "pf_qk<T, 4, NSUB>(s, dq, st1, true, bars.full(1, 1), par ^ 1)"),
    "wg1.sb_l": (K, W1, "pf_qk<T, 0, 4>(s, dq, st1, false, bars.full(1, 0), par ^ 1)"),
    "wg1.sb_wait": (K, W1, "bars.full(1, 0), par ^ 1)", "wgmma_wait<0>();"),
    "rows.call": (K, END),
    "wg1.lsum_write": ("@ss", RS, "s_fin[MT + r_lo] = l[0]"),
    "wg1.lsum": ("@ss", RS, "bar_arrive(SS_LSUM, 256)"),
    "wg0.lsum": ("@ss", RS, "bar_sync(SS_LSUM, 256)"),
    "wg0.tot": ("@ss", RS, "s_fin[r] = l[hi] + s_fin[MT + r]"),
    "wg0.mfin": ("@ss", RS, "s_fin[MT + r] = m_run[hi]"),
    "wg1.fin": (K, END, "bar_sync(PF_FIN, 256)"),
    "wg0.fin": (K, END, "bar_arrive(PF_FIN, 256)"),
    "wg0.bar_wg0": (K, END, "bar_sync(BAR_WG0, 128)"),
    "store.call": (K, END, "pf_store<T>(p, t, h0, st0"),
    "store.l": (PS, "const float l = l_tot[r];"),
    "store.stage": (PS, "st_shared_u32(stage + (r * S + col0 + 8 * i + 2 * qd) * 2"),
    "store.bar": (PS, "bar_sync(bar, 128)"),
    "store.out": (PS, "*reinterpret_cast<uint4*>(out + r * p.o_sh + c)"),
    "store.lse": (PS, "const float l = l_tot[wtid];"),
    "ce.land": None,  # the copy engine
}
S = protocol_sim.Sites(FILES, {k: None if not chain else (chain[0], chain[1:], 0) if chain[0] in FILES
                              else ("", chain, 0) for k, chain in SITES.items()}, "(the copy engine)")
locate_sites, MISSING_SITES, where, lineno = S.locate, S.missing, S.where, S.line


# ---------------------------------------------------------------------------------------------
BN = 64  # tokens a tile
W = 128  # a warpgroup's threads (an actor's weight)
COPY_SETS = 2  # the producer's threads as sets with their own copies and noinc arrivals
SCALE0, SCALE1, P0_READY, RO1, LSUM, BAR_WG0, PF_FIN, BAR_WG1 = 1, 2, 3, 4, 6, 7, 8, 10
BAR_NAMES = {1: "SS_SCALE0", 2: "SS_SCALE1", 3: "SS_P0_READY", 4: "SS_RO1", 6: "SS_LSUM", 7: "BAR_WG0",
             8: "PF_FIN", 10: "BAR_WG1"}
HALVES = {"L": ["L"], "R": ["R", "R8"]}  # a half-tile's parts: L = blocks 0-3, R = blocks 4-8

# Injected bugs: name -> (what, sites). --self-test expects each caught with and without the intent checks.
BUGS = {
    "no_free_wait": ("the producer refills every half without waiting on its free[b][h] barrier",
                     ["pr.free00", "pr.free11", "pr.free01", "pr.free10"]),
    "no_free_wait_01": ("the producer refills A.R (buffer 0's blocks 4-8, P0's block) without waiting on "
                        "free[0][1]", ["pr.free01"]),
    "release_too_early": ("WG1 arrives on free[0][1] before its wgmma_wait<0> on P0 V(A.R)",
                          ["wg1.free01", "wg1.wait0"]),
    "free10_too_early": ("WG0 arrives on free[1][0] before the wgmma_wait<1> / <0> that completes P1 V(B.L)",
                         ["wg0.free10", "wg0.wait1"]),
    "flags_before_free": ("the producer writes buffer 0's token flags (and arrives on vfull[0]) before waiting "
                          "on free[0][0]", ["pr.flags0", "pr.free00"]),
    "p0_over_wrong_block": ("P0 lies over buffer 1's rope block (block 8 of tile B) instead of buffer 0's: the "
                            "producer refills B.R after free[1][1], which WG1 arrives on before its P0 V is "
                            "done", ["wg0.p0", "wg1.pv_remote"]),
    "no_ro1_sync": ("WG0 skips bar_sync(SS_RO1) before P1 V", ["wg0.ro1"]),
    "no_p0_ready_sync": ("WG1 skips bar_sync(SS_P0_READY) before P0 V", ["wg1.p0_ready"]),
    "p0_ready_before_p0": ("WG0 arrives on SS_P0_READY before writing P0", ["wg0.p0_ready", "wg0.p0"]),
    "wrong_parity": ("the consumers wait on full[b][h] with the parity of pair + 1", ["qk.wait", "wg0.full10",
                                                                                     "wg1.full01"]),
    "free_parity_k": ("the producer waits on free[b][h] with parity k & 1 instead of (k - 1) & 1",
                      ["pr.free00", "pr.free11", "pr.free01", "pr.free10"]),
    "vfull_parity_off": ("WG0 waits on vfull[0] with the parity of pair + 1", ["wg0.vfull"]),
    "stage_before_lsum": ("WG0 stages its O columns over buffer 0 before bar_sync(SS_LSUM) (its row sums "
                          "taken as known): WG1's last P0 V may still read buffer 0", ["store.stage", "wg0.lsum"]),
    "lsum_before_write": ("WG1 arrives on SS_LSUM before writing its row sums (s_fin[MT + r])",
                          ["wg1.lsum", "wg1.lsum_write"]),
    "fin_before_totals": ("WG0 arrives on PF_FIN before ss_row_sums writes the totals (s_fin[r])",
                          ["wg0.fin", "wg0.tot"]),
    "full_count_64": ("full[b][h] initialised with count 64 (half the producer's threads)", ["init.full"]),
}
# Removals the model finds nothing against: information on what it cannot see, not advice.
ABLATIONS = {
    "no_full01_wait_wg1": ("drop WG1's mbar_wait(full[0][1]) before P0 V: WG0's S(A) waited for the same phase "
                           "before its P0_READY arrival (proxy visibility of the copies is not modelled)",
                           ["wg1.full01"]),
    "no_full10_wait_wg0": ("drop WG0's mbar_wait(full[1][0]) before P1 V: WG1's S(B) waited for the same phase "
                           "before its RO1 arrival", ["wg0.full10"]),
    "no_vfull_wait": ("WG0 reads the token flags without waiting on vfull[0]: the leads write them before "
                      "their A.L copies, whose noinc arrivals complete the full[0][0] phase WG0 waited for "
                      "before (S(A)); whether that arrival publishes the leads' plain stores is a memory-model "
                      "question the model does not judge", ["wg0.vfull"]),
    "no_q_full_wait": ("the consumers do not wait on q_full: every producer thread's noinc arrival on the first "
                       "full[b][h] they wait for lands only after its Q copies (the same memory-model question)",
                       ["c.q_full"]),
    "no_bar_wg0": ("drop bar_sync(BAR_WG0, 128) before pf_store (orders WG0's own threads: not modelled)",
                   ["wg0.bar_wg0"]),
    "no_cp_wait": ("drop the producer's cp_async_wait<0> at its exit (every copy is waited for by a consumer)",
                   ["pr.cpwait"]),
}
WAITS = ["c.q_full", "wg0.sa_l0", "wg0.sa_r0", "wg0.sa_l", "wg0.sa_r", "wg1.sb_r0", "wg1.sb_l0", "wg1.sb_r",
         "wg1.sb_l", "wg0.vfull", "wg0.scale1", "wg0.full10", "wg0.ro1", "wg0.lsum", "wg1.vfull",
         "wg1.scale0", "wg1.p0_ready", "wg1.full01", "wg1.fin", "pr.free00", "pr.free11", "pr.free01",
         "pr.free10", "pr.cpwait"]


def tagstr(tag):
    if tag is None:
        return "nothing (never written)"
    name = tag[0]
    if name == "kv":
        return f"pair {tag[1]} tile {tag[2]}"
    if name == "flags":
        return f"flags of pair {tag[1]} tile {tag[2]}"
    if name in ("P0", "P1", "m_A", "m_B"):
        return f"{name} of pair {tag[1]}"
    if name == "O":
        return f"WG{tag[1]}'s staged O"
    return {"Q": "Q", "m_fin": "the final maxima", "l1": "WG1's row sums", "tot": "the row-sum totals"}.get(name,
                                                                                                          str(tag))


def partstr(parts):
    return "" if list(parts) == [""] else f"[{','.join(parts)}]"


protocol_sim.bind(S, tagstr)


class Op:
    def __init__(self, kind, site, **kw):
        self.kind, self.site, self.arrived, self.blocked = kind, site, False, False
        self.__dict__.update(kw)

    def describe(self):
        k, o = self.kind, self
        if k == "mwait":
            return f"mbar_wait({o.bar.name}, parity {o.parity}) meaning phase {o.meant}"
        if k == "marrive":
            return f"mbar_arrive({o.bar.name}) x{o.n} for phase {o.meant}"
        if k == "noinc":
            return f"cp.async.mbarrier.arrive.noinc({o.bar.name}) for phase {o.meant}"
        if k == "cpwait":
            return "cp_async_wait<0>() (its copies landed)"
        if k in ("barrive", "bsync"):
            return f"bar_{k[1:]}({o.bar.bid} {o.bar.name}, {o.n}) for {o.label}" + (" [arrived]" if o.arrived else "")
        if k in ("rbegin", "rend", "issue"):
            what = {"rbegin": "read", "rend": "end read", "issue": "wgmma issue + commit, reading"}[k]
            return f"{what} " + ", ".join(f"{b}{partstr(ps)} ({tagstr(t)})" for b, ps, t in o.reads)
        if k == "gwait":
            return f"wgmma_wait<{o.n}>()"
        what = dict(wbegin="write", wend="end write", copy="cp.async into")[k]
        return f"{what} {o.buf}{partstr(o.parts)} ({tagstr(o.tag)})"


class Actor:  # a warpgroup: gen its program, op the step it is at, ctx where it is (for the reports)
    def __init__(self, name):
        self.name, self.gen, self.op, self.ctx = name, None, None, ""
        self.groups = []  # wgmma commit groups pending: [(reads, site)]


# ---------------------------------------------------------------------------------------------
class Sim(SimBase):
    def __init__(self, tiles, bugs, intent=True):
        self.tiles, self.B, self.intent = tiles, set(bugs), intent
        self.pairs = (tiles + 1) // 2
        full_count = 64 if "full_count_64" in self.B else 128
        self.q_full = MBar("q_full", 128, intent)
        self.full = [[MBar(f"full[{b}][{h}]", full_count, intent) for h in range(2)] for b in range(2)]
        self.free = [[MBar(f"free[{b}][{h}]", 128, intent) for h in range(2)] for b in range(2)]
        self.vfull = [MBar(f"vfull[{b}]", 16, intent) for b in range(2)]
        self.mbars = [self.q_full] + self.full[0] + self.full[1] + self.free[0] + self.free[1] + self.vfull
        self.nbars = {b: NamedBar(BAR_NAMES[b], intent, bid=b) for b in BAR_NAMES}
        self.bufs = {"Q": {"L": Part(), "R": Part()},
                     "buf0": {f"{p}/{c}": Part() for p in ("L", "R", "R8") for c in (0, 1)},
                     "buf1": {p: Part() for p in ("L", "R", "R8")},
                     "valid[0]": {"": Part()}, "valid[1]": {"": Part()}, "P1": {"": Part()},
                     "s_m": {"A": Part(), "B": Part()}, "s_l": {"0": Part(), "1": Part()}}
        self.batches = {}  # in flight: id -> (set, write id)
        self.writes = {}  # write id -> [buf, parts, batches left]
        self.noincs = []  # pending noinc arrivals: [set, bar, meant, ids it waits for, site]
        self.nid = 0
        self.blocked_waits = collections.Counter()  # site -> waits that did not return at once
        self.trace = collections.deque(maxlen=400)
        self.actors = [Actor(n) for n in ("WG0", "WG1", "WG2")]
        progs = (self.prog_wg0, self.prog_wg1, self.prog_wg2)
        for a, prog in zip(self.actors, progs):
            a.gen = prog(a)
            a.op = next(a.gen, None)

    # Who must read a write, how often, before it may be overwritten.
    def readers(self, buf, part, tag):
        if buf == "Q":  # S of every tile
            return {"WG0": self.pairs, "WG1": self.tiles // 2}
        if tag[0] == "O":
            return {f"WG{tag[1]}": 1}
        if tag[0] == "P0":
            return {"WG1": 1}
        if buf == "buf0":  # S(A) (WG0) reads every part; WG0's P V its V columns (L), WG1's P0 V its (R)
            p = part.split("/")[0]
            return {"WG0": 2} if p == "L" else {"WG0": 1, "WG1": 1} if p == "R" else {"WG0": 1}
        if buf == "buf1":  # S(B) (WG1) reads every part; WG0's P1 V reads L, WG1's P V R
            return {"WG1": 1, "WG0": 1} if part == "L" else {"WG1": 2} if part == "R" else {"WG1": 1}
        if buf == "valid[0]":
            return {"WG0": 1}
        if buf == "valid[1]":
            return {"WG1": 1}
        if buf == "P1":
            return {"WG0": 1}
        if buf == "s_m":  # m_A (WG1), m_B (WG0)
            return {"WG1": 1} if tag[0] == "m_A" else {"WG0": 1}
        if buf == "s_l":  # s_fin of ss_row_sums: [0] the totals (both pf_store, WG0's lse); [1] WG1's row
            return {"WG0": 2, "WG1": 1} if tag[0] == "tot" else {"WG0": 1}  # sums (WG0), the maxima (lse)
        raise AssertionError(buf)

    def parts(self, b, half, cols=(0, 1)):
        """The parts of buffer b's half ("L", "R" with block 8, "R8", "R4": blocks 4-7 only)."""
        ps = {"L": ["L"], "R": ["R", "R8"], "R4": ["R"], "R8": ["R8"]}[half]
        return [f"{p}/{c}" for p in ps for c in cols] if b == 0 else ps

    # -- buffer accesses ------------------------------------------------------------------
    def wbegin(self, who, buf, parts, tag, site):
        for name in parts:
            begin_write(self.bufs[buf][name], f"{buf}{'[' + name + ']' if name else ''}", who, tag,
                        self.readers(buf, name, tag), site)

    def wend(self, buf, parts):
        for name in parts:
            end_write(self.bufs[buf][name])

    def rbegin(self, who, reads, site):
        for buf, ps, tag in reads:
            for name in ps:
                begin_read(self.bufs[buf][name], f"{buf}{'[' + name + ']' if name else ''}", who, tag, site)

    def rend(self, who, reads):  # (a write that starts during the read is caught at its start)
        for buf, ps, tag in reads:
            for name in ps:
                end_read(self.bufs[buf][name], who)

    # -- programs -----------------------------------------------------------------------------
    def read(self, reads, site):
        yield Op("rbegin", site, reads=reads)
        yield Op("rend", site, reads=reads)

    def write(self, buf, parts, tag, site):
        yield Op("wbegin", site, buf=buf, parts=parts, tag=tag)
        yield Op("wend", site, buf=buf, parts=parts, tag=tag)

    def full_wait(self, b, h, pair, site):
        par = (pair + 1) & 1 if "wrong_parity" in self.B else pair & 1
        return Op("mwait", site, bar=self.full[b][h], parity=par, meant=pair)

    def qk(self, b, half, pair, site):
        """pf_qk at `site`: the half's full wait, then one commit group reading Q's and the buffer's half."""
        tag = ("kv", pair, 2 * pair + b)
        yield self.full_wait(b, 0 if half == "L" else 1, pair, site)
        yield Op("issue", site, reads=[("Q", [half], ("Q",)), (f"buf{b}", self.parts(b, half), tag)])

    def bsync(self, bid, n, label, site):
        return Op("bsync", site, bar=self.nbars[bid], n=n, label=label)

    def barrive(self, bid, n, label, site):
        return Op("barrive", site, bar=self.nbars[bid], n=n, label=label)

    def prog_wg0(self, me):
        B, pairs, tiles = self.B, self.pairs, self.tiles
        me.ctx = "prologue"
        if "no_q_full_wait" not in B:
            yield Op("mwait", "c.q_full", bar=self.q_full, parity=0, meant=0)
        yield from self.qk(0, "L", 0, "wg0.sa_l0")
        yield from self.qk(0, "R", 0, "wg0.sa_r0")
        yield Op("gwait", "wg0.sa_wait0", n=0)
        for k in range(pairs):
            par, has_b, has_a2 = k & 1, 2 * k + 1 < tiles, k + 1 < pairs
            me.ctx = f"pair {k}"
            a_tag = ("kv", k, 2 * k)
            if "no_vfull_wait" not in B:
                vpar = (k + 1) & 1 if "vfull_parity_off" in B else par
                yield Op("mwait", "wg0.vfull", bar=self.vfull[0], parity=vpar, meant=k)
            yield from self.read([("valid[0]", [""], ("flags", k, 2 * k))], "wg0.mask")
            yield from self.write("s_m", ["A"], ("m_A", k), "wg0.m_a")
            yield self.barrive(SCALE0, 256, ("SCALE0", k), "wg0.scale0")
            yield Op("issue", "wg0.pv_local", reads=[("buf0", self.parts(0, "L"), a_tag)])
            yield Op("gwait", "wg0.pv_wait", n=0)
            yield Op("marrive", "wg0.free00", bar=self.free[0][0], n=W, meant=k)
            yield self.bsync(SCALE1, 256, ("SCALE1", k), "wg0.scale1")
            yield from self.read([("s_m", ["B"], ("m_B", k))], "wg0.m_b")
            p0 = ("buf1", self.parts(1, "R8")) if "p0_over_wrong_block" in B else ("buf0", self.parts(0, "R8"))
            p0_ready = self.barrive(P0_READY, 256, ("P0_READY", k), "wg0.p0_ready")
            if "p0_ready_before_p0" in B:
                yield p0_ready
            yield from self.write(p0[0], p0[1], ("P0", k), "wg0.p0")
            if "p0_ready_before_p0" not in B:
                yield p0_ready
            if has_b:
                if "no_full10_wait_wg0" not in B:
                    yield self.full_wait(1, 0, k, "wg0.full10")
                if "no_ro1_sync" not in B:
                    yield self.bsync(RO1, 256, ("RO1", k), "wg0.ro1")
                yield Op("issue", "wg0.pv_remote", reads=[("P1", [""], ("P1", k)),
                                                          ("buf1", self.parts(1, "L"), ("kv", k, 2 * k + 1))])
            if has_a2:
                yield from self.qk(0, "L", k + 1, "wg0.sa_l")
            if has_b:
                f10 = Op("marrive", "wg0.free10", bar=self.free[1][0], n=W, meant=k)
                if "free10_too_early" in B:
                    yield f10
                yield Op("gwait", "wg0.wait1" if has_a2 else "wg0.wait0b", n=1 if has_a2 else 0)
                if "free10_too_early" not in B:
                    yield f10
            if has_a2:
                yield from self.qk(0, "R", k + 1, "wg0.sa_r")
            yield Op("gwait", "wg0.wait_end", n=0)
        me.ctx = "end"
        stage_early = "stage_before_lsum" in B
        if stage_early:
            yield from self.write("buf0", self.parts(0, "L", (0,)) + self.parts(0, "R", (0,)), ("O", 0), "store.stage")
        yield self.bsync(LSUM, 256, ("LSUM",), "wg0.lsum")
        yield from self.read([("s_l", ["1"], ("l1",))], "wg0.tot")
        fin = self.barrive(PF_FIN, 256, ("PF_FIN",), "wg0.fin")
        if "fin_before_totals" in B:
            yield fin
        yield from self.write("s_l", ["0"], ("tot",), "wg0.tot")
        yield from self.write("s_l", ["1"], ("m_fin",), "wg0.mfin")
        if "fin_before_totals" not in B:
            yield fin
        if "no_bar_wg0" not in B:
            yield self.bsync(BAR_WG0, 128, ("BAR_WG0", "totals"), "wg0.bar_wg0")
        yield from self.store(me, 0, stage_early)

    def store(self, me, w, staged):
        """pf_store of warpgroup w: its O columns / l staged over buffer 0, its barrier, the copy out."""
        me.ctx = "pf_store"
        stage = self.parts(0, "L", (w,)) + self.parts(0, "R", (w,))
        yield from self.read([("s_l", ["0"], ("tot",))], "store.l")
        if not staged:
            yield from self.write("buf0", stage, ("O", w), "store.stage")
        yield self.bsync(BAR_WG1 if w else BAR_WG0, 128, (f"BAR_WG{w}", "store"), "store.bar")
        yield from self.read([("buf0", stage, ("O", w))], "store.out")
        if w == 0:
            yield from self.read([("s_l", ["0"], ("tot",)), ("s_l", ["1"], ("m_fin",))], "store.lse")
        me.ctx = "returned"

    def prog_wg1(self, me):
        B, pairs, tiles = self.B, self.pairs, self.tiles
        me.ctx = "prologue"
        if "no_q_full_wait" not in B:
            yield Op("mwait", "c.q_full", bar=self.q_full, parity=0, meant=0)
        if tiles > 1:
            yield from self.qk(1, "R", 0, "wg1.sb_r0")
            yield from self.qk(1, "L", 0, "wg1.sb_l0")
            yield Op("gwait", "wg1.sb_wait0", n=0)
        for k in range(pairs):
            par, has_b, has_b2 = k & 1, 2 * k + 1 < tiles, 2 * k + 3 < tiles
            me.ctx = f"pair {k}"
            b_tag = ("kv", k, 2 * k + 1)
            if has_b:
                yield Op("mwait", "wg1.vfull", bar=self.vfull[1], parity=par, meant=k)
                yield from self.read([("valid[1]", [""], ("flags", k, 2 * k + 1))], "wg1.mask")
            yield self.bsync(SCALE0, 256, ("SCALE0", k), "wg1.scale0")
            yield from self.read([("s_m", ["A"], ("m_A", k))], "wg1.m_a")
            yield from self.write("s_m", ["B"], ("m_B", k), "wg1.m_b")
            yield self.barrive(SCALE1, 256, ("SCALE1", k), "wg1.scale1")
            if has_b:
                yield from self.write("P1", [""], ("P1", k), "wg1.p1")
                yield Op("issue", "wg1.pv_local", reads=[("buf1", self.parts(1, "R4"), b_tag)])
            if "no_p0_ready_sync" not in B:
                yield self.bsync(P0_READY, 256, ("P0_READY", k), "wg1.p0_ready")
            if "no_full01_wait_wg1" not in B:
                yield self.full_wait(0, 1, k, "wg1.full01")
            p0 = ("buf1", self.parts(1, "R8")) if "p0_over_wrong_block" in B else ("buf0", self.parts(0, "R8"))
            yield Op("issue", "wg1.pv_remote", reads=[(p0[0], p0[1], ("P0", k)),
                                                      ("buf0", self.parts(0, "R4"), ("kv", k, 2 * k))])
            f01 = Op("marrive", "wg1.free01", bar=self.free[0][1], n=W, meant=k)
            if has_b:
                yield self.barrive(RO1, 256, ("RO1", k), "wg1.ro1")
                yield Op("gwait", "wg1.wait1", n=1)
                yield Op("marrive", "wg1.free11", bar=self.free[1][1], n=W, meant=k)
            if "release_too_early" in B:
                yield f01
            yield Op("gwait", "wg1.wait0", n=0)
            if "release_too_early" not in B:
                yield f01
            if has_b2:
                yield from self.qk(1, "R", k + 1, "wg1.sb_r")
                yield from self.qk(1, "L", k + 1, "wg1.sb_l")
                yield Op("gwait", "wg1.sb_wait", n=0)
        me.ctx = "end"
        lsum = self.barrive(LSUM, 256, ("LSUM",), "wg1.lsum")
        if "lsum_before_write" in B:
            yield lsum
        yield from self.write("s_l", ["1"], ("l1",), "wg1.lsum_write")
        if "lsum_before_write" not in B:
            yield lsum
        yield self.bsync(PF_FIN, 256, ("PF_FIN",), "wg1.fin")
        yield from self.store(me, 1, False)

    def prog_wg2(self, me):
        B, pairs, tiles = self.B, self.pairs, self.tiles
        me.ctx = "Q"
        yield Op("copy", "pr.q", buf="Q", parts=["L", "R"], tag=("Q",))
        yield Op("noinc", "pr.q_full", bar=self.q_full, meant=0)

        def free_wait(b, h, k, site):
            if k == 0 or "no_free_wait" in B or ("no_free_wait_01" in B and (b, h) == (0, 1)):
                return
            par = k & 1 if "free_parity_k" in B else (k - 1) & 1
            yield Op("mwait", site, bar=self.free[b][h], parity=par, meant=k - 1)

        def half(b, h, k, free_site, copy_site, full_site, flags_site=None):
            tag = ("kv", k, 2 * k + b)
            me.ctx = f"pair {k}: {'AB'[b]}.{'LR'[h]}"
            flags = []
            if flags_site is not None:  # publish: the group leads' flags, their arrival on vfull[b]
                flags = [Op("wbegin", flags_site, buf=f"valid[{b}]", parts=[""], tag=("flags", k, 2 * k + b)),
                         Op("wend", flags_site, buf=f"valid[{b}]", parts=[""], tag=("flags", k, 2 * k + b)),
                         Op("marrive", flags_site, bar=self.vfull[b], n=16, meant=k)]
            if b == 0 and flags and "flags_before_free" in B:
                yield from flags
                flags = []
            yield from free_wait(b, h, k, free_site)
            yield from flags
            yield Op("copy", copy_site, buf=f"buf{b}", parts=self.parts(b, "LR"[h]), tag=tag)
            yield Op("noinc", full_site, bar=self.full[b][h], meant=k)

        for k in range(pairs):
            has_b = 2 * k + 1 < tiles
            yield from half(0, 0, k, "pr.free00", "pr.copy_al", "pr.full00", "pr.flags0")
            if has_b:
                yield from half(1, 1, k, "pr.free11", "pr.copy_br", "pr.full11", "pr.flags1")
            yield from half(0, 1, k, "pr.free01", "pr.copy_ar", "pr.full01")
            if has_b:
                yield from half(1, 0, k, "pr.free10", "pr.copy_bl", "pr.full10")
        me.ctx = "exit"
        if "no_cp_wait" not in B:
            yield Op("cpwait", "pr.cpwait")
        me.ctx = "returned"

    # -- scheduling -------------------------------------------------------------------------
    def enabled(self, a):
        if a.op.kind == "cpwait":  # cp.async.wait_group 0: the producer's copies have all landed
            return not self.batches
        return SimBase.enabled(self, a)

    def step(self, a):
        op, k = a.op, a.op.kind
        who = f"{a.name} ({a.ctx})"
        record_step(op, self.trace, self.blocked_waits, a.name, a.ctx)
        advance = True
        if k == "mwait":
            check_wait(op, who, self.intent)
        elif k == "marrive":
            op.bar.arrive(op.n, op.meant, who, op.site)
        elif k == "noinc":
            for s in range(COPY_SETS):
                deps = {i for i, (cs, _) in self.batches.items() if cs == s}
                self.noincs.append([s, op.bar, op.meant, deps, op.site])
        elif k == "copy":
            self.wbegin("WG2 (cp.async)", op.buf, op.parts, op.tag, op.site)
            wid = self.nid
            self.nid += 1
            self.writes[wid] = [op.buf, op.parts, COPY_SETS, op.tag]
            for s in range(COPY_SETS):
                self.batches[self.nid] = (s, wid)
                self.nid += 1
        elif k == "barrive":
            op.bar.arrive(op.n, W, op.label, who, op.site)
        elif k == "bsync":
            if not op.arrived:
                op.gen = op.bar.arrive(op.n, W, op.label, who, op.site)
                op.arrived = True
                advance = False
        elif k == "rbegin":
            self.rbegin(a.name, op.reads, op.site)
        elif k == "rend":
            self.rend(a.name, op.reads)
        elif k == "issue":
            self.rbegin(a.name, op.reads, op.site)
            a.groups.append((op.reads, op.site))
        elif k == "gwait":
            while len(a.groups) > op.n:
                reads, _ = a.groups.pop(0)
                self.rend(a.name, reads)
        elif k == "wbegin":
            self.wbegin(a.name, op.buf, op.parts, op.tag, op.site)
        elif k == "wend":
            self.wend(op.buf, op.parts)
        if advance:
            a.op = next(a.gen, None)
            if a.op is None and a.groups:
                raise Violation("race", f"{a.name} ends with {len(a.groups)} wgmma group(s) pending")

    def ce_events(self):
        """The copy engine's possible next events: a batch landing, a noinc arrival whose copies landed."""
        ev = [("batch", i) for i in self.batches]
        ev += [("noinc", j) for j, n in enumerate(self.noincs) if not (n[3] & self.batches.keys())]
        return ev

    def ce_step(self, ev):
        kind, i = ev
        if kind == "batch":
            s, wid = self.batches.pop(i)
            w = self.writes[wid]
            w[2] -= 1
            self.trace.append(("CE", "", "ce.land", f"set {s}'s copies into {w[0]}{partstr(w[1])} "
                               f"({tagstr(w[3])}) land"))
            if w[2] == 0:
                self.wend(w[0], w[1])
                del self.writes[wid]
            return
        s, bar, meant, _, site = self.noincs.pop(i)
        self.trace.append(("CE", "", site, f"set {s}'s noinc arrival on {bar.name} (phase {meant}) lands"))
        bar.arrive(128 // COPY_SETS, meant, f"WG2 set {s} (noinc)", site, "noinc arrival")

    def engine(self):
        return self.ce_events()

    def engine_step(self, ev, i):
        self.ce_step(ev[i])

    def final_checks(self):
        end_checks(self.mbars, self.nbars.values(), [(f"{buf}{'[' + name + ']' if name else ''}", p)
                                                    for buf, parts in self.bufs.items() for name, p in parts.items()])

    def state(self):
        def groups(a):
            return [f"        wgmma groups pending: " + "; ".join(lineno(s) for _, s in a.groups)] if a.groups else []

        out = actor_lines(self, extra=groups) + barrier_lines(self.mbars, self.nbars.values())
        inflight = [f"set {s} -> {self.writes[w][0]}{partstr(self.writes[w][1])} ({tagstr(self.writes[w][3])})"
                    for s, w in self.batches.values()]
        inflight += [f"set {n[0]} noinc on {n[1].name} (phase {n[2]})" for n in self.noincs]
        out.append("  copy engine: " + (", ".join(inflight) or "nothing in flight"))
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------
def case_for(run, seed, fixed):
    """The run's generator and tile count: the given counts in turn, else 1..7 for the first seven runs,
    then a random topk in 1..448 (tiles = ceil(topk / 64))."""
    rng = random.Random(f"{seed}:{run}")
    if fixed is not None:
        tiles = fixed[run % len(fixed)]
        return rng, "given tiles", tiles, tiles * BN
    if run < 7:
        return rng, "fixed tile count", run + 1, (run + 1) * BN - (run % 3) * 17
    topk = rng.randint(1, 7 * BN)
    return rng, "random topk", (topk + BN - 1) // BN, topk


def explore(runs, seed, bugs, fixed_segs=None, only_run=None, ntrace=12, quiet=False, max_reports=3, intent=True,
            stop_after=None):
    """`fixed_segs` (--segments): [(0, tiles), ...], the tile counts the runs take in turn."""
    fixed = None if fixed_segs is None else [t1 - t0 for t0, t1 in fixed_segs]

    def case(run):
        rng, cname, tiles, topk = case_for(run, seed, fixed)
        return rng, cname, (tiles, topk), tiles, f"{tiles} tile{'s' if tiles > 1 else ''}"

    def report(run, cname, c, res, v, sim):
        tiles, topk = c
        what = (f"{cname}: topk {topk}, {tiles} tile(s), {(tiles + 1) // 2} pair(s)"
                + (" (the last without B)" if tiles % 2 else ""))
        print_report(run, seed, bugs, "" if intent else "--no-intent-checks ", res, v, [what], sim, ntrace,
                     (3, 18, 6))

    return protocol_sim.explore(runs, seed, bugs, case,
                                lambda c, rng: run_once(Sim(c[0], bugs, intent), rng, 100000), report, only_run,
                                quiet, max_reports, stop_after)


def self_test(seed, runs_per_bug):
    return protocol_sim.self_test(explore, BUGS, ABLATIONS, seed, runs_per_bug, 24, 1000,
                                  ablation_note="; the model\n  ignores proxy fences and the order between a "
                                  "warpgroup's own threads")


def main():
    return protocol_cli.main(__doc__, KERNEL, locate_sites, MISSING_SITES, BUGS, ABLATIONS, where, self_test,
                             explore, WAITS)


if __name__ == "__main__":
    run(main)
