#!/usr/bin/env python3
"""Executable model of the synchronization protocol of `decode_wgmma_fp8r`
(kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh, its fp8 form), explored over random interleavings
to find deadlocks and shared-memory races before the kernel runs on a GPU. Standard library
only (Python 3.11). The kernel-independent machinery (barriers, race bookkeeping, scheduler,
reports, self-test) is tools/models/protocol_sim.py's, the command line protocol_cli.py's.

What it models
--------------
Two forms of warpgroups 1 and 2 (--form): vt (the kernel's default, F8R_VT: per tile the FULL
wait, the scale factors of the slot's tile into a table of the slot (after a bar.red of the 256
threads on W3_PV_PAIR), P_FULL, then 16 steps that read the slot's codes and the table into
registers and P by wgmma, EMPTY after the steps, P_FREE after the wgmma wait, the issuing lane's
refill) and stage (F8R_VT=0: V dequantized into the warpgroup's half of a shared stage, described
below). --slots: the ring's depth, W3Layout<true>::SLOTS (F8R_RING with F8R_VT; the stage form
keeps 2): tile u sits in slot u % SLOTS, its FULL / EMPTY waits take the parity of its fill
u / SLOTS.
Actors (each a generator that steps through the kernel's code, one synchronization or
shared-memory access per step; a step is atomic):
  WG0  warpgroup 0 (128 threads): per segment bar_sync(Q_READY), s_pinv; per tile
       mbar_wait(FULL), S (the slot and Q read by wgmma until wgmma_wait<0>), nvalid,
       mbar_arrive(EMPTY), mbar_wait(P_FREE) (u >= 1), P and s_alpha, bar_arrive(P_FULL);
       s_fin, bar_arrive(FIN).
  ISS  thread 128 (lane 0 of warp 4), the issuing lane: all of warpgroup 1's code with weight 1,
       plus its own TileWalk, the two prologue loads and, per tile, walk.next(),
       w3_lookup (the block table, read-only), mbar_wait(EMPTY) and w3_issue (nvalid,
       expect_tx, six TMA boxes).
  W4R  the other 31 lanes of warp 4 (warpgroup 1's code, weight 31). Only these wait for the
       issuing lane at the two __syncwarp() (a two-party rendezvous of ISS and W4R).
  W57  warps 5..7 (warpgroup 1's code, weight 96): they do not take part in __syncwarp.
  WG2  warpgroup 2 (128 threads).
  TMA  the copy engine: each issued box completes (its bytes land, then complete_tx on FULL)
       at a random later step, in any order.
  Splitting warpgroup 1 into ISS / W4R / W57 is what "the rest of the warp waits for the lane"
  needs: warps 5..7 are not held by warp 4's __syncwarp. Between two __syncwarp, ISS and W4R
  step independently (a superset of what a converged warp does); bar.sync / bar.arrive count
  threads (an actor adds its weight), not warps.
mbarriers as in PTX: a pending-arrival count and a tx count per phase; a phase completes when
  both reach 0 (the completed-phase count then grows by one, the current parity flips and the
  pending count is reset); arrivals beyond a completed phase's count go to the next phase;
  mbarrier.try_wait.parity P returns once the current phase parity != P. expect_tx is the
  arrive.expect_tx of the code (tx += bytes, then one arrival). FULL[2] (count 1 + tx),
  EMPTY[2] (384), P_FREE (256); an actor's arrival counts its weight in threads.
Named barriers (ids 1 P_FULL, 2 Q_READY, 3 FIN, 4 / 5 the warpgroups' V barriers, and warp 4's
  __syncwarp as a 32-thread one): bar.arrive / bar.sync add the actor's weight; an instance
  completes at the given count; bar.sync waits for the instance it arrived on.
Shared buffers, each made of parts (one per writing actor): ring[2] (TMA), nvalid[2] (ISS),
  V[wg1] (ISS, W4R, W57), V[wg2] (WG2), Q and s_pinv (ISS, W4R, W57, WG2), P, s_alpha and s_fin
  (WG0). Writes and reads are intervals (begin / end steps; a TMA write runs from the issue of
  the first box to the landing of the last one). Every write is tagged (segment, tile) or
  (segment,) and records who must read it how often before it may be overwritten (e.g. Q of
  segment k: WG0, once per tile of k).
Checks (a run stops at its first violation):
  race       a write that starts while a read of the same part is open, or before a reader
             that must read the previous contents has read them (write after read); a read
             that finds the part being written or holding another tag than the (segment,
             tile) it expects (read after write).
  named      arrivals of two different instances (as the code means them: P_FULL of tile u,
             Q_READY / FIN of segment k, ...) pending on one id, arrivals beyond the count, two
             different thread counts on one instance, an instance left incomplete at the end.
  mbarrier   an mbar_wait that returns before the phase the code means has completed (its
             parity matched an older phase); an arrival or complete_tx that lands in another
             phase than the one meant; arrivals beyond the count while the phase still waits
             for bytes; a phase left half-done at the end.
  deadlock   no actor can step and not all are done: the state is printed (each actor's
             blocking operation with its kernel line, the barriers, the TMA in flight).
  The instance-mixing check and the two "meant phase" checks use what the code means by each
  wait and arrival (tile u, segment k): the intent checks. --no-intent-checks leaves only the
  PTX-level rules (counts, tx, parity), the data tags and deadlocks; --self-test runs both ways.
  The kernel line of each step is found by searching the kernel file for a snippet of its
  code (SITES); a snippet that is no longer there is reported (the model may be out of date) and
  fails --self-test.

What it does not model
----------------------
- Races inside a warpgroup (between its threads or warps, other than the W4R / W57 / ISS split):
  a warpgroup's accesses are one interval; per-thread addresses (swizzles, banks) are not
  modeled at all.
- The memory model beyond ordering by barriers: proxy fences (fence.proxy.async before
  wgmma / TMA), release / acquire scopes, the mbarrier initialization fence and find_part's
  __syncthreads (the prologue is taken as done), __all_sync / shuffles, alignment (.aligned)
  rules of bar.sync beyond the __syncwarp rendezvous.
- Values: S, softmax, dequantization, masking, the contents of nvalid; the F8R_LAB builds
  (F8R_LAB == 4 expects 0 bytes) and the global-memory epilogue.
- Scheduling fairness or timing: the interleavings are random (per run, each actor and the copy
  engine get a random pace that changes now and then), not exhaustive; a finding comes with the
  seed and run to replay it. The normal mode prints how often each wait actually had to wait,
  as a measure of what the runs exercised.
- The schedule's arithmetic (find_part / next_segment): each CTA gets a list of segments
  (t0, t1) with t1 > t0, as next_segment yields them (it skips empty sequences); all actors walk
  that list, the issuing lane through a copy of TileWalk::next.

How to run
----------
  python3 tools/models/fp8raw_protocol.py                 # 2000 random runs, seed 1 (--form vt, 2 slots)
  python3 tools/models/fp8raw_protocol.py --form vt --slots 3 --self-test   # the three-slot ring
  python3 tools/models/fp8raw_protocol.py --form stage --self-test          # the F8R_VT=0 lab's loop
  python3 tools/models/fp8raw_protocol.py --runs 5000 --seed 7
  python3 tools/models/fp8raw_protocol.py --segments 3,1,2 --runs 200   # fixed tile counts
  python3 tools/models/fp8raw_protocol.py --bug no_empty_wait           # one injected bug
  python3 tools/models/fp8raw_protocol.py --self-test     # injects each bug, expects a catch
  python3 tools/models/fp8raw_protocol.py --list-bugs
  python3 tools/models/fp8raw_protocol.py --run 17 --trace 60   # replay run 17 of the seed
  python3 tools/models/fp8raw_protocol.py --no-intent-checks    # PTX-level + data checks only
Exit status: 0 when no violation or deadlock was found (--self-test: every bug caught and the
unmodified protocol clean), 1 otherwise.
"""

import collections

import protocol_cli
import protocol_sim
from protocol_cli import run
from protocol_sim import (MBar, NamedBar, Part, SimBase, Violation, actor_lines, barrier_lines, begin_read, begin_write,
                          check_wait, end_checks, end_read, end_write, explore_segments, fixed_cases, random_segments,
                          record_step, run_once)

KERNEL = "kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh"

# ---------------------------------------------------------------------------------------------
# Kernel lines: a snippet of the code (and which occurrence) for every modeled step.
SITES = {
    "wg0.q_ready": ("bar_sync(W3_Q_READY, W3_THREADS)", 0),
    "wg0.pinv": ("pinv[0] = s_pinv[r_lo]", 0),
    "wg0.full": ("mbar_wait(full + L::FULL_STRIDE * slot, L::phase(u))", 0),
    "wg0.qk": ("f8r_qk(s, dq, sRing + slot * F8R_SLOT", 0),
    "wg0.nvalid": ("const int nv = nvalid[slot]", 0),
    "wg0.empty": ("release(empty + 8 * slot)", 0),
    "wg0.pfree": ("if (u >= 1) mbar_wait(pfree, (u - 1) & 1)", 0),
    "wg0.p": ("store_p_rows(sP, pk, wwarp, lane)", 0),
    "wg0.alpha": ("s_alpha[r_lo] = alpha[0]", 0),
    "wg0.p_full": ("bar_arrive(W3_P_FULL, W3_THREADS)", 0),
    "wg0.fin_store": ("store_fin(s_fin, l_run, m_run, r_lo, qd)", 0),
    "wg0.fin": ("bar_arrive(W3_FIN, W3_THREADS)", 0),
    "iss.prologue": ("w3_issue<RAW, PAIR, PG>(p, w3_lookup<PG>(p, walk), sRing + v * L::SLOT", 0),
    "issue.nvalid": ("*nvalid = b.word", 0),
    "issue.expect": ("mbar_expect_tx(full, ", 0),
    "issue.code": ("tma_load_3d(dst + g * F8R_BOX", 0),
    "issue.rope": ("tma_load_3d(dst + 4 * F8R_BOX", 0),
    "issue.scales": ("tma_load_3d(dst + F8R_SCALES", 0),
    "wg12.syncwarp0": ("__syncwarp();", 2),
    "wg12.split_q": ("f8r_split_q(p, sg.b, row0, sQ, s_pinv, threadIdx.x - 128)", 0),
    "wg12.q_ready": ("bar_arrive(W3_Q_READY, W3_THREADS)", 1),
    "wg12.full": ("mbar_wait(full + L::FULL_STRIDE * slot, L::phase(u))", 1),
    "wg12.pfree": ("u >= 1) mbar_wait(pfree, (u - 1) & 1)", 1),
    "wg12.dequant": ("f8r_dequant_v(sRing + slot * F8R_SLOT", 0),
    "wg12.empty": ("mbar_arrive(empty + 8 * slot)", 1),
    "wg12.wgbar": ("bar_sync(W3_WG1 + w, 128)", 1),
    "iss.empty": ("mbar_wait(empty + 8 * slot, L::phase(u))", 0),
    "iss.issue": ("w3_refill<RAW>(issuer, walk, p, part, u, sRing + slot * F8R_SLOT", 0),
    "wg12.syncwarp1": ("__syncwarp();", 0),
    "wg12.p_full": ("bar_sync(W3_P_FULL, W3_THREADS)", 1),
    "wg12.alpha": ("rescale(o, s_alpha[r_lo], s_alpha[r_lo + 8])", 0),
    "wg12.pv": ("pv_tile<T, 128>(o, dp, RAW ? dv", 0),
    "wg12.pfree_arrive": ("mbar_arrive(pfree)", 1),
    "wg12.fin": ("bar_sync(W3_FIN, W3_THREADS)", 1),
    "wg12.store": ("w3_store<T>(p, sg, row0, o, fin,", 0),
    "vt.split_q": ("f8r_split_q(p, sg.b, row0, sQ, s_pinv, threadIdx.x - 128)", 0),
    "vt.pv_pair": ("bar_sync(W3_PV_PAIR, 256)", 0),
    "vt.q_ready": ("bar_arrive(W3_Q_READY, W3_THREADS)", 0),
    "vt.full": ("mbar_wait(full + 8 * slot, L::phase(u))", 0),
    "vt.factors": ("const bool one = vt_factors(scales, CP ? BN : nvalid[slot], tab", 0),
    "vt.red": ("bar.red.and.pred q, %2, 256, p", 0),
    "vt.p_full": ("bar_sync(W3_P_FULL, W3_THREADS);  // P(u) and its rescale factors; the factor table", 0),
    "vt.alpha": ("al[i][c] = s_alpha[8 * i + 2 * qd + c]", 0),
    "vt.steps": ("st = vt_step(raw, tab, 2 * w + j, ks, kw, qd)", 0),
    "vt.empty": ("if constexpr (!CP) mbar_arrive(empty + 8 * slot)", 0),
    "vt.pfree_arrive": ("mbar_arrive(pfree);  // P(u) and its factors are read", 0),
    "vt.refill": ("w3_refill<true>(issuer, walk, p, part, u, raw, empty, full, nvalid, maps)", 0),
    "vt.fin": ("bar_sync(W3_FIN, W3_THREADS)", 0),
    "vt.store": ("const float l = s_fin[r];", 0),
    "tma.land": (None, 0),
}
S = protocol_sim.Sites({"": KERNEL}, {k: None if snip is None else ("", (snip,), nth)
                                         for k, (snip, nth) in SITES.items()}, "(the copy engine)")
locate_sites, MISSING_SITES, where, lineno = S.locate, S.missing, S.where, S.line

# ---------------------------------------------------------------------------------------------
# Constants of the kernel.
THREADS = 384  # W3_THREADS
SLOTS = 2  # W3Layout<true>::SLOTS: F8R_RING with F8R_VT, else 2 (--slots)
FORM = "vt"  # the warpgroups 1 and 2 loop modelled: "vt" (F8R_VT, the default) or "stage" (--form)
BOX = 64 * 128  # F8R_BOX
BOXES = [("code group 0", BOX, "issue.code"), ("code group 1", BOX, "issue.code"),
         ("code group 2", BOX, "issue.code"), ("code group 3", BOX, "issue.code"),
         ("rope", BOX, "issue.rope"), ("scales", 64 * 16, "issue.scales")]
SLOT_BYTES = 5 * BOX + 64 * 16  # F8R_SLOT = 41984
assert SLOT_BYTES == sum(b for _, b, _ in BOXES) == 41984
P_FULL, Q_READY, FIN, WGBAR, PV_PAIR = 1, 2, 3, 4, 6  # W3_P_FULL, W3_Q_READY, W3_FIN, W3_WG1 (+1: WG2), W3_PV_PAIR
BAR_NAMES = {1: "P_FULL", 2: "Q_READY", 3: "FIN", 4: "WG1", 5: "WG2", 6: "PV_PAIR", "warp4": "__syncwarp(warp 4)"}

# Thread groups: name, warpgroup, weight (threads), issuing lane, takes part in warp 4's __syncwarp.
GROUPS = [("WG0", 0, 128, False, False), ("ISS", 1, 1, True, True), ("W4R", 1, 31, False, True),
          ("W57", 1, 96, False, False), ("WG2", 2, 128, False, False)]
CONSUMERS = [g[0] for g in GROUPS]  # every thread reads each slot and its nvalid
WG12 = ["ISS", "W4R", "W57", "WG2"]
MEMBERS = {1: ["ISS", "W4R", "W57"], 2: ["WG2"]}
assert sum(g[2] for g in GROUPS) == THREADS and sum(g[2] for g in GROUPS if g[1] == 1) == 128

# Injected bugs: name -> (what, sites). Expected to be caught by --self-test.
BUGS = {
    "no_pfree_wait_v": ("WG1/WG2 do not wait on P_FREE before dequantizing V(u)", ["wg12.pfree"]),
    "no_empty_wait": ("the issuing lane does not wait on EMPTY before refilling the slot", ["iss.empty"]),
    "full_parity_local": ("FULL waits take the parity from the segment-local tile index (t - sg.t0) "
                          "instead of the running count u", ["wg0.full", "wg12.full"]),
    "no_q_ready_sync": ("WG0 does not bar_sync(Q_READY)", ["wg0.q_ready"]),
    "no_pfree_wait_p": ("WG0 does not wait on P_FREE before writing P(u)", ["wg0.pfree"]),
    "no_fin_sync": ("WG1/WG2 do not bar_sync(FIN) before the epilogue reads s_fin", ["wg12.fin"]),
    "early_empty_wg0": ("WG0 arrives on EMPTY before S reads the slot (arrive moved above f8r_qk)",
                        ["wg0.empty", "wg0.qk"]),
    "pfree_before_pv": ("WG1/WG2 arrive on P_FREE before rescale and P V read s_alpha, P, V",
                        ["wg12.pfree_arrive", "wg12.pv"]),
    "short_tx": ("expect_tx leaves out the scale box's 1024 bytes", ["issue.expect"]),
    "fin_before_store": ("WG0 arrives on FIN before store_fin writes s_fin", ["wg0.fin", "wg0.fin_store"]),
    "q_ready_before_split": ("WG1/WG2 arrive on Q_READY before f8r_split_q writes Q and s_pinv",
                             ["wg12.q_ready", "wg12.split_q"]),
}
# --form vt: the stage form's V bugs do not exist there; its own.
# early_empty_wg0 is not a bug there: warpgroups 1 and 2 arrive on EMPTY only after P_FULL(u), which
# warpgroup 0 reaches after S(u) read the slot, so its early arrival cannot complete the phase.
_STAGE_ONLY = ("no_pfree_wait_v", "pfree_before_pv", "early_empty_wg0")
BUGS_VT = {
    "vt_empty_before_steps": ("WG1/WG2 arrive on EMPTY before the 16 steps read the codes and factors",
                              ["vt.empty", "vt.steps"]),
    "vt_pfree_before_steps": ("WG1/WG2 arrive on P_FREE before the steps' products read P",
                              ["vt.pfree_arrive", "vt.steps"]),
    "vt_factors_before_full": ("vt_factors reads the slot's scales and nvalid before the FULL wait",
                               ["vt.factors", "vt.full"]),
    "vt_no_p_full_sync": ("WG1/WG2 do not bar_sync(P_FULL) before reading s_alpha and P", ["vt.p_full"]),
}
# --slots 3: the parity of a two-slot ring kept with three slots.
BUGS_RING = {
    "phase_of_two_slots": ("FULL / EMPTY waits take the fill as u >> 1 (two slots) with a deeper ring",
                           ["vt.full", "wg0.full", "iss.empty"]),
}
# Removals the model finds no violation for (shown by --self-test as information). Not advice to
# remove them: the model ignores convergence (bar.sync is bar.sync.aligned: warp 4 must be
# converged, which the __syncwarp after the issuing lane's branch provides) and proxy fences.
ABLATIONS = {
    "no_wg_bar": ("drop bar_sync(W3_WG1 + w, 128) (the V half's barrier)", ["wg12.wgbar"]),
    "no_syncwarp": ("drop both __syncwarp() (warp 4 no longer waits for the issuing lane; still needed "
                    "for the convergence bar.sync.aligned requires, which the model does not check)",
                    ["wg12.syncwarp0", "wg12.syncwarp1"]),
}
ABLATIONS_VT = {
    "vt_no_red": ("drop the factors' bar.red (each warpgroup writes and reads only its own groups' factors; "
                  "the barrier decides `one` for the tile's values, which the model does not check)", ["vt.red"]),
    "no_syncwarp": ABLATIONS["no_syncwarp"],
    "early_empty_wg0": ("WG0 arrives on EMPTY before S reads the slot (warpgroups 1 and 2 arrive only after "
                        "P_FULL(u), which follows S(u))", ["wg0.empty", "wg0.qk"]),
}


def fill(u):
    """The slot, the FULL / EMPTY parity and the fill (the phase meant) of the CTA's tile u."""
    return u % SLOTS, (u // SLOTS) & 1, u // SLOTS


# ---------------------------------------------------------------------------------------------
def tagstr(tag):
    if tag is None:
        return "nothing (never written)"
    if len(tag) == 1:
        return f"seg {tag[0]}"
    return f"seg {tag[0]} tile {tag[1]}"


protocol_sim.bind(S, tagstr)


class Buf:
    def __init__(self, name, parts):
        self.name = name
        self.parts = {p: Part() for p in parts}


class Op:
    __slots__ = ("kind", "site", "bar", "parity", "meant", "n", "label", "reads", "buf", "tag", "slot", "box",
                 "nbytes", "arrived", "gen", "what", "blocked")

    def __init__(self, kind, site, **kw):
        self.kind, self.site = kind, site
        self.arrived = self.blocked = False
        for k, v in kw.items():
            setattr(self, k, v)

    def describe(self):
        k = self.kind
        if k == "mwait":
            return f"mbar_wait({self.bar.name}, parity {self.parity}) meaning phase {self.meant}"
        if k in ("marrive", "expect_tx"):
            return f"{k}({self.bar.name}) for phase {self.meant}"
        if k in ("barrive", "bsync"):
            s = "bar_sync" if k == "bsync" else "bar_arrive"
            lab = f" for {self.label}" if self.label is not None else ""
            return f"{s}({self.bar.bid} {self.bar.name}, {self.n}){lab}" + (
                " [arrived, waiting]" if self.arrived else "")
        if k in ("rbegin", "rend"):
            return f"{'read' if k == 'rbegin' else 'end read'} " + ", ".join(
                f"{b} ({tagstr(t)})" for b, t in self.reads)
        if k in ("wbegin", "wend"):
            return f"{'write' if k == 'wbegin' else 'end write'} {self.buf} ({tagstr(self.tag)})"
        if k == "tma":
            return f"TMA issue {self.what} of {tagstr(self.tag)} into slot {self.slot}"
        return k


class Actor:
    def __init__(self, name, wg, weight, issuer, warp4):
        self.name, self.wg, self.weight, self.issuer, self.warp4 = name, wg, weight, issuer, warp4
        self.gen, self.op, self.ctx = None, None, ""


class TileWalk:
    """TileWalk of the kernel over the segment list (k: the segment's index in the list)."""

    def __init__(self, segs):
        self.segs, self.si, self.t, self.t1, self.k = segs, 0, 0, 0, None
        self.n = -1  # tiles issued so far - 1: the CTA's tile count (fill(n))

    def next(self):
        if self.t + 1 < self.t1:
            self.t += 1
            self.n += 1
            return True
        if self.si >= len(self.segs):  # next_segment: no more sequences (stays false)
            return False
        self.k = self.si
        self.t, self.t1 = self.segs[self.si]
        self.si += 1
        self.n += 1
        return True


# ---------------------------------------------------------------------------------------------
class Sim(SimBase):
    def __init__(self, segs, bugs, rng, intent=True):
        self.segs, self.bugs, self.rng, self.intent = segs, set(bugs), rng, intent
        self.full = [MBar(f"FULL[{s}]", 1, intent) for s in range(SLOTS)]
        self.empty = [MBar(f"EMPTY[{s}]", THREADS, intent) for s in range(SLOTS)]
        self.pfree = MBar("P_FREE", 256, intent)
        self.mbars = self.full + self.empty + [self.pfree]
        self.nbars = {b: NamedBar(BAR_NAMES[b], intent, bid=b) for b in (1, 2, 3, 4, 5, 6, "warp4")}
        self.bufs = {}
        for s in range(SLOTS):
            self.bufs[f"ring[{s}]"] = Buf(f"ring[{s}]", ["TMA"])
            self.bufs[f"nvalid[{s}]"] = Buf(f"nvalid[{s}]", ["ISS"])
            for wg in (1, 2):  # --form vt: the factor table of the slot's tile, each warpgroup's groups
                self.bufs[f"tab[{s}][wg{wg}]"] = Buf(f"tab[{s}][wg{wg}]", MEMBERS[wg])
        self.bufs["V[wg1]"] = Buf("V[wg1]", MEMBERS[1])
        self.bufs["V[wg2]"] = Buf("V[wg2]", MEMBERS[2])
        for b in ("Q", "s_pinv"):
            self.bufs[b] = Buf(b, WG12)
        for b in ("P", "s_alpha", "s_fin"):
            self.bufs[b] = Buf(b, ["WG0"])
        self.blocked_waits = collections.Counter()  # site -> waits that did not return at once
        self.tma = []  # in flight: (slot, box index, bytes, tag, meant phase)
        self.ring_left = [0] * SLOTS
        self.trace = collections.deque(maxlen=400)
        self.actors = []
        for name, wg, weight, issuer, warp4 in GROUPS:
            a = Actor(name, wg, weight, issuer, warp4)
            a.gen = self.prog_wg0(a) if wg == 0 else self.prog_vt(a) if FORM == "vt" else self.prog_wg12(a)
            a.op = next(a.gen, None)
            self.actors.append(a)

    # Who must read a write, how often, before it may be overwritten.
    def readers(self, buf, tag):
        if buf.startswith("ring") and FORM == "vt":  # warpgroups 1 and 2: the factors' scales, then the steps
            return {a: 1 if a == "WG0" else 2 for a in CONSUMERS}
        if buf.startswith("ring") or buf.startswith("nvalid"):
            return {a: 1 for a in CONSUMERS}
        if buf.startswith("tab"):  # its own warpgroup's steps
            return {a: 1 for a in MEMBERS[1 if buf.endswith("[wg1]") else 2]}
        if buf == "V[wg1]":
            return {a: 1 for a in MEMBERS[1]}
        if buf == "V[wg2]":
            return {a: 1 for a in MEMBERS[2]}
        if buf == "Q":  # S of every tile of the segment
            t0, t1 = self.segs[tag[0]]
            return {"WG0": t1 - t0}
        if buf == "s_pinv":
            return {"WG0": 1}
        return {a: 1 for a in WG12}  # P, s_alpha, s_fin

    # -- buffer accesses ------------------------------------------------------------------
    def wbegin(self, who, bufname, part, tag, site):
        buf = self.bufs[bufname]
        loc = f"{bufname}[{part}]" if len(buf.parts) > 1 else bufname
        begin_write(buf.parts[part], loc, who, tag, self.readers(bufname, tag), site)

    def wend(self, bufname, part):
        end_write(self.bufs[bufname].parts[part])

    def rbegin(self, who, reads, site):
        for bufname, tag in reads:
            buf = self.bufs[bufname]
            for pname, p in buf.parts.items():
                begin_read(p, f"{bufname}[{pname}]" if len(buf.parts) > 1 else bufname, who, tag, site)

    def rend(self, who, reads, site):
        for bufname, tag in reads:
            for p in self.bufs[bufname].parts.values():
                if p.tag != tag or p.writing is not None:  # (a write start would have been caught)
                    raise Violation("race", f"{who}'s read of {bufname} ({tagstr(tag)}) saw it change "
                                    f"({where(site)})")
                end_read(p, who)

    # -- programs ---------------------------------------------------------------------------
    def read(self, reads, site):
        yield Op("rbegin", site, reads=reads)
        yield Op("rend", site, reads=reads)

    def write(self, buf, tag, site):
        yield Op("wbegin", site, buf=buf, tag=tag)
        yield Op("wend", site, buf=buf, tag=tag)

    def prog_wg0(self, me):
        B = self.bugs
        u = 0
        for k, (t0, t1) in enumerate(self.segs):
            me.ctx = f"seg {k}"
            if "no_q_ready_sync" not in B:
                yield Op("bsync", "wg0.q_ready", bar=self.nbars[Q_READY], n=THREADS, label=("Q_READY", k))
            yield from self.read([("s_pinv", (k,))], "wg0.pinv")
            for t in range(t0, t1):
                slot, par, meant = fill(u)
                me.ctx = f"seg {k} tile {t} u={u}"
                par = self.parity(u, t - t0, par)
                yield Op("mwait", "wg0.full", bar=self.full[slot], parity=par, meant=meant)
                empty = Op("marrive", "wg0.empty", bar=self.empty[slot], meant=meant)
                if "early_empty_wg0" in B:
                    yield empty
                yield from self.read([(f"ring[{slot}]", (k, t)), ("Q", (k,))], "wg0.qk")
                yield from self.read([(f"nvalid[{slot}]", (k, t))], "wg0.nvalid")
                if "early_empty_wg0" not in B:
                    yield empty
                if u >= 1 and "no_pfree_wait_p" not in B:
                    yield Op("mwait", "wg0.pfree", bar=self.pfree, parity=(u - 1) & 1, meant=u - 1)
                yield from self.write("P", (k, t), "wg0.p")
                yield from self.write("s_alpha", (k, t), "wg0.alpha")
                yield Op("barrive", "wg0.p_full", bar=self.nbars[P_FULL], n=THREADS, label=("P_FULL", u))
                u += 1
            me.ctx = f"seg {k} end"
            fin = Op("barrive", "wg0.fin", bar=self.nbars[FIN], n=THREADS, label=("FIN", k))
            if "fin_before_store" in B:
                yield fin
            yield from self.write("s_fin", (k,), "wg0.fin_store")
            if "fin_before_store" not in B:
                yield fin
        me.ctx = "returned"

    def parity(self, u, t_local, par):
        """The parity a FULL / EMPTY wait of tile u takes (par: the kernel's), under the injected bugs."""
        if "full_parity_local" in self.bugs:
            return ((t_local // SLOTS) & 1)
        if "phase_of_two_slots" in self.bugs:
            return (u >> 1) & 1
        return par

    def issue(self, me, walk, slot, site):
        """w3_issue<true>, called at `site`."""
        tag, meant = (walk.k, walk.t), fill(walk.n)[2]
        assert fill(walk.n)[0] == slot
        ctx = me.ctx
        me.ctx = f"{ctx} ({lineno(site)}: issuing {tagstr(tag)})"
        yield from self.write(f"nvalid[{slot}]", tag, "issue.nvalid")
        nbytes = SLOT_BYTES - (64 * 16 if "short_tx" in self.bugs else 0)
        yield Op("expect_tx", "issue.expect", bar=self.full[slot], nbytes=nbytes, meant=meant)
        for i, (what, nb, s) in enumerate(BOXES):
            yield Op("tma", s, slot=slot, box=i, nbytes=nb, tag=tag, meant=meant, what=what)
        me.ctx = ctx

    def prologue(self, me, walk):
        """Warpgroup 1's start: the issuing lane's first SLOTS tiles, then warp 4's __syncwarp."""
        if me.issuer:
            me.ctx = "prologue"
            v = 0
            while v < SLOTS and walk.next():
                yield from self.issue(me, walk, v, "iss.prologue")
                v += 1
        if me.warp4 and "no_syncwarp" not in self.bugs:
            yield Op("bsync", "wg12.syncwarp0", bar=self.nbars["warp4"], n=32, label=None)

    def segment_start(self, k, pre):
        """Segment k's start in warpgroups 1 and 2 (sites `pre`.*): f8r_split_q writes Q's parts and
        s_pinv (vt: then the 256 threads meet on W3_PV_PAIR), then the Q_READY arrival."""
        qr = Op("barrive", f"{pre}.q_ready", bar=self.nbars[Q_READY], n=THREADS, label=("Q_READY", k))
        if "q_ready_before_split" in self.bugs:
            yield qr
        for op in ("wbegin", "wend"):
            for buf in ("Q", "s_pinv"):
                yield Op(op, f"{pre}.split_q", buf=buf, tag=(k,))
        if pre == "vt":
            yield Op("bsync", "vt.pv_pair", bar=self.nbars[PV_PAIR], n=256, label=("Q", k))
        if "q_ready_before_split" not in self.bugs:
            yield qr

    def wg12_loop(self, me, pre, tile, end):
        """Warpgroups 1 and 2's walk over the CTA's segments and tiles, as both forms have it: the
        prologue, each segment's start (sites `pre`.*), tile(k, t, u, slot, par, meant, walk) for
        each tile (par: the FULL / EMPTY parity under the injected bugs), then the segment's FIN
        barrier (site `pre`.fin) and its store (site `end`)."""
        u = 0
        walk = TileWalk(self.segs) if me.issuer else None
        yield from self.prologue(me, walk)
        for k, (t0, t1) in enumerate(self.segs):
            me.ctx = f"seg {k}"
            yield from self.segment_start(k, pre)
            for t in range(t0, t1):
                slot, par, meant = fill(u)
                me.ctx = f"seg {k} tile {t} u={u}"
                yield from tile(k, t, u, slot, self.parity(u, t - t0, par), meant, walk)
                u += 1
            me.ctx = f"seg {k} end"
            if "no_fin_sync" not in self.bugs:
                yield Op("bsync", f"{pre}.fin", bar=self.nbars[FIN], n=THREADS, label=("FIN", k))
            yield from self.read([("s_fin", (k,))], end)
        me.ctx = "returned"

    def refill(self, me, walk, u, slot, meant, site):
        """The issuing lane's w3_refill (tile u + SLOTS into tile u's slot), then warp 4's
        reconvergence."""
        B = self.bugs
        if me.issuer and walk.next():
            if "no_empty_wait" not in B:
                yield Op("mwait", "iss.empty", bar=self.empty[slot],
                         parity=fill(u)[1] if "full_parity_local" in B else self.parity(u, 0, fill(u)[1]),
                         meant=meant)
            yield from self.issue(me, walk, slot, site)
        if me.warp4 and "no_syncwarp" not in B:
            yield Op("bsync", "wg12.syncwarp1", bar=self.nbars["warp4"], n=32, label=None)

    def prog_wg12(self, me):
        B = self.bugs
        w = me.wg - 1
        vbuf = f"V[wg{me.wg}]"

        def tile(k, t, u, slot, par, meant, walk):
            yield Op("mwait", "wg12.full", bar=self.full[slot], parity=par, meant=meant)
            if u >= 1 and "no_pfree_wait_v" not in B:
                yield Op("mwait", "wg12.pfree", bar=self.pfree, parity=(u - 1) & 1, meant=u - 1)
            yield from self.read([(f"nvalid[{slot}]", (k, t))], "wg12.dequant")  # the argument
            yield Op("rbegin", "wg12.dequant", reads=[(f"ring[{slot}]", (k, t))])
            yield Op("wbegin", "wg12.dequant", buf=vbuf, tag=(k, t))
            yield Op("wend", "wg12.dequant", buf=vbuf, tag=(k, t))
            yield Op("rend", "wg12.dequant", reads=[(f"ring[{slot}]", (k, t))])
            yield Op("marrive", "wg12.empty", bar=self.empty[slot], meant=meant)
            if "no_wg_bar" not in B:
                yield Op("bsync", "wg12.wgbar", bar=self.nbars[WGBAR + w], n=128, label=(f"WG{me.wg}", u))
            yield from self.refill(me, walk, u, slot, meant, "iss.issue")
            yield Op("bsync", "wg12.p_full", bar=self.nbars[P_FULL], n=THREADS, label=("P_FULL", u))
            pf = Op("marrive", "wg12.pfree_arrive", bar=self.pfree, meant=u)
            if "pfree_before_pv" in B:
                yield pf
            yield from self.read([("s_alpha", (k, t))], "wg12.alpha")
            yield from self.read([("P", (k, t)), (vbuf, (k, t))], "wg12.pv")
            if "pfree_before_pv" not in B:
                yield pf

        return self.wg12_loop(me, "wg12", tile, "wg12.store")

    def prog_vt(self, me):
        """Warpgroups 1 and 2 with F8R_VT (f8r_vt_loop, the TMA form): no V stage; per tile the
        factor table of the slot's tile, then the 16 steps read the slot's codes, the table and P."""
        B = self.bugs
        tab = f"wg{me.wg}"

        def tile(k, t, u, slot, par, meant, walk):
            factors = self.read([(f"nvalid[{slot}]", (k, t)), (f"ring[{slot}]", (k, t))], "vt.factors")
            if "vt_factors_before_full" in B:
                yield from factors
            yield Op("mwait", "vt.full", bar=self.full[slot], parity=par, meant=meant)
            if "vt_factors_before_full" not in B:
                yield from factors
            if "vt_no_red" not in B:
                yield Op("bsync", "vt.red", bar=self.nbars[PV_PAIR], n=256, label=("RED", u))
            yield from self.write(f"tab[{slot}][{tab}]", (k, t), "vt.factors")
            if "vt_no_p_full_sync" not in B:
                yield Op("bsync", "vt.p_full", bar=self.nbars[P_FULL], n=THREADS, label=("P_FULL", u))
            else:  # its arrival still counts for warpgroup 0's instance
                yield Op("barrive", "vt.p_full", bar=self.nbars[P_FULL], n=THREADS, label=("P_FULL", u))
            yield from self.read([("s_alpha", (k, t))], "vt.alpha")
            steps = [(f"ring[{slot}]", (k, t)), (f"tab[{slot}][{tab}]", (k, t))]
            empty = Op("marrive", "vt.empty", bar=self.empty[slot], meant=meant)
            pfree = Op("marrive", "vt.pfree_arrive", bar=self.pfree, meant=u)
            if "vt_empty_before_steps" in B:
                yield empty
            if "vt_pfree_before_steps" in B:
                yield pfree
            yield Op("rbegin", "vt.steps", reads=steps + [("P", (k, t))])
            yield Op("rend", "vt.steps", reads=steps)  # the codes and factors: loaded into registers
            if "vt_empty_before_steps" not in B:
                yield empty
            yield Op("rend", "vt.steps", reads=[("P", (k, t))])  # P: read by wgmma until its wait
            if "vt_pfree_before_steps" not in B:
                yield pfree
            yield from self.refill(me, walk, u, slot, meant, "vt.refill")

        return self.wg12_loop(me, "vt", tile, "vt.store")

    # -- scheduling (enabled: SimBase's) ------------------------------------------------------
    def step(self, a):
        op = a.op
        k = op.kind
        record_step(op, self.trace, self.blocked_waits, a.name, a.ctx)
        advance = True
        if k == "mwait":
            check_wait(op, f"{a.name} ({a.ctx})", self.intent)
        elif k == "marrive":
            op.bar.arrive(a.weight, op.meant, f"{a.name} ({a.ctx})", op.site)
        elif k == "expect_tx":
            op.bar.expect_tx(op.nbytes, op.meant, f"{a.name} ({a.ctx})", op.site)
        elif k == "tma":
            if op.box == 0:
                self.wbegin("TMA", f"ring[{op.slot}]", "TMA", op.tag, op.site)
                self.ring_left[op.slot] = len(BOXES)
            self.tma.append((op.slot, op.box, op.nbytes, op.tag, op.meant))
        elif k == "barrive":
            op.bar.arrive(op.n, a.weight, op.label, f"{a.name} ({a.ctx})", op.site)
        elif k == "bsync":
            if not op.arrived:
                op.gen = op.bar.arrive(op.n, a.weight, op.label, f"{a.name} ({a.ctx})", op.site)
                op.arrived = True
                advance = False
        elif k == "rbegin":
            self.rbegin(a.name, op.reads, op.site)
        elif k == "rend":
            self.rend(a.name, op.reads, op.site)
        elif k == "wbegin":
            self.wbegin(a.name, op.buf, a.name, op.tag, op.site)  # each writer owns its part
        elif k == "wend":
            self.wend(op.buf, a.name)
        if advance:
            a.op = next(a.gen, None)

    def tma_step(self, i):
        slot, box, nbytes, tag, meant = self.tma.pop(i)
        what = f"TMA box '{BOXES[box][0]}' of {tagstr(tag)} into slot {slot}"
        self.trace.append(("TMA", "", "tma.land", f"{what} lands"))
        self.ring_left[slot] -= 1
        if self.ring_left[slot] == 0:
            self.wend(f"ring[{slot}]", "TMA")
        self.full[slot].complete_tx(nbytes, meant, what)

    def engine(self):
        return self.tma

    def engine_step(self, ev, i):
        self.tma_step(i)

    def final_checks(self):
        end_checks(self.mbars, self.nbars.values(),
                   [(f"{b.name}[{pname}]", p) for b in self.bufs.values() for pname, p in b.parts.items()])

    def state(self):
        out = actor_lines(self, 4) + barrier_lines(self.mbars, self.nbars.values())
        out.append("  TMA in flight: " + (", ".join(f"slot {s} box {BOXES[b][0]} ({tagstr(t)})"
                                                    for s, b, _, t, _ in self.tma) or "none"))
        return "\n".join(out)


# ---------------------------------------------------------------------------------------------
FIXED_CASES = fixed_cases(12, 7, 19)


def explore(runs, seed, bugs, fixed_segs=None, only_run=None, ntrace=12, quiet=False, max_reports=3, intent=True,
            stop_after=None):
    """The random runs (protocol_sim.explore's statistics)."""
    return explore_segments(runs, seed, bugs, fixed_segs, only_run, ntrace, quiet, max_reports, stop_after, FIXED_CASES,
                            lambda rng: random_segments(rng, 14, 16),
                            lambda segs, rng: run_once(Sim(segs, bugs, rng, intent), rng, 200000),
                            (f"--form {FORM} --slots {SLOTS} " + ("" if intent else "--no-intent-checks ")), (4, 34, 5))


def self_test(seed, runs_per_bug):
    return protocol_sim.self_test(explore, BUGS, ABLATIONS, seed, runs_per_bug, 24, 500,
                                  ablation_note="; the model\n  ignores convergence for bar.sync.aligned and proxy "
                                  "fences")


WAITS_STAGE = ["wg0.q_ready", "wg0.full", "wg0.pfree", "wg12.syncwarp0", "wg12.full", "wg12.pfree", "wg12.wgbar",
               "iss.empty", "wg12.syncwarp1", "wg12.p_full", "wg12.fin"]
WAITS_VT = ["wg0.q_ready", "wg0.full", "wg0.pfree", "wg12.syncwarp0", "vt.pv_pair", "vt.full", "vt.red", "vt.p_full",
            "iss.empty", "wg12.syncwarp1", "vt.fin"]
WAITS = list(WAITS_STAGE)


def configure(args):
    """--form: the warpgroups 1 and 2 loop modelled, its bugs, ablations and reported waits; --slots:
    the ring's depth (more than two only with the vt form, as the kernel's layout allows)."""
    global FORM, SLOTS
    FORM, SLOTS = args.form, args.slots
    if SLOTS < 2 or (SLOTS > 2 and FORM != "vt"):
        raise SystemExit("--slots: 2, or more with --form vt (the stage form keeps two)")
    if FORM == "vt":
        for name in _STAGE_ONLY:
            del BUGS[name]
        BUGS.update(BUGS_VT)
        ABLATIONS.clear()
        ABLATIONS.update(ABLATIONS_VT)
        WAITS[:] = WAITS_VT
    if SLOTS > 2:
        BUGS.update(BUGS_RING)


def main():
    form = (["--form"], dict(choices=("vt", "stage"), default="vt",
                             help="warpgroups 1 and 2: vt (F8R_VT, the default: V^T built in registers) or stage "
                                  "(F8R_VT=0: V dequantized into a shared stage)"))
    slots = (["--slots"], dict(type=int, default=2, help="tiles in the raw ring (F8R_RING; default 2)"))
    return protocol_cli.main(__doc__, KERNEL, locate_sites, MISSING_SITES, BUGS, ABLATIONS, where, self_test,
                             explore, WAITS, options=(form, slots), configure=configure)


if __name__ == "__main__":
    run(main)
