#!/usr/bin/env python3
"""Executable model of the synchronization protocol of the gather forms (CP) of the three-warpgroup MLA
decode kernel (kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh: decode_wgmma_3wg<T, RAW, true>),
explored over random interleavings to find deadlocks and shared-memory races before the kernel runs on a
GPU. --form 16 (the default): the 16-bit form (RAW = false: w3_gather, w3_load_q_regs); --form fp8: the
fp8_ds_mla form (RAW = true: w3_gather_raw, f8r_split_q, f8r_qk, f8r_dequant_v; the default loop, not
F8R_VT's f8r_vt_loop). Standard library only (Python 3.11); the conventions of
tools/models/fp8raw_protocol.py (the fp8 TMA form's model).

What it models
  Actors, generators that step through the code (prog_wg0, prog_wg12, gather) one synchronization or
  shared-memory access at a time, a step being atomic: WG0, WG1, WG2 (one actor per warpgroup, 128
  threads) and CE, the copy engine, which lands each issued cp.async batch (one part of one gather) at a
  random later step, in any order.
  mbarriers as in PTX: a pending count and a phase; the phase completes when the count reaches 0 (the
  parity flips, the count is reset); arrivals beyond a phase's count go to the next one; try_wait.parity P
  returns once the current parity != P. FULL[2] (init 256) and P_FREE (256); EMPTY is unused by both forms.
  mbar_track_cp_async (cp.async.mbarrier.arrive without .noinc) raises the current phase's count by 128
  now and lowers it once all of the actor's earlier copies have landed (per thread in the kernel; a phase
  needs all 256 threads, so it completes at the same moments).
  Named barriers P_FULL, Q_READY, FIN (384), WG1 / WG2 (128), PV_PAIR (256): an actor adds 128; an
  instance completes at its count; bar.sync waits for the instance it arrived on.
  Writes are tagged (segment, tile) or (segment,) and list who must read them how often before they may
  be overwritten (readers()). Buffers of parts:
  16-bit  slot[s] = V1, V2 (the V columns of WG1 / WG2), R1, R2 (the rope halves), each written by one
          warpgroup's copies (w3_gather); flags[s] (WG1's plain stores); Q (WG1, WG2: w3_load_q_regs);
          P, s_alpha, s_fin (WG0). S(u) reads the whole slot, P V(u) of WG1 / WG2 its V half in the slot,
          then bar_sync(W3_WG1 + w, 128) and the gather of tile u + 2 into the slot.
  fp8     slot[s] = C0..C3 (the code groups), R1, R2 (the rope's halves), S1, S2 (the scales of groups
          0, 1 / 2, 3); warpgroup w (actor WG{w + 1}) copies C{2w}, C{2w + 1}, R{w + 1}, S{w + 1}
          (w3_gather_raw), WG1 also the slot's flags[s]. S(u) (f8r_qk) reads every part, Q and, once a
          segment after Q_READY, s_pinv; warpgroup w's f8r_dequant_v reads C{2w}, C{2w + 1}, S{w + 1} and
          writes V[V{w + 1}], its half of the single V stage, which its P V reads. Q and s_pinv: WG1 and
          WG2 (f8r_split_q: rows 0..31 / 32..63, s_pinv by the threads with grp == 0 of both).
          Per tile WG1 / WG2: FULL wait, P_FREE(u - 1) wait (u >= 1), the dequantization,
          bar_sync(W3_WG1 + w, 128), bar_sync(P_FULL), s_alpha, P V, mbar_arrive(P_FREE), the gather of
          tile u + 2 into the slot (no barrier between P V and the gather: P V reads V, not the slot).
  Warps (fp8 only): a warpgroup's P V reads all 64 rows of its V half while each warp's dequantization
  writes its own 16 token rows, and each warp's gather writes rows other warps' dequantization read: an
  order between the warps of one warpgroup. So in the fp8 form those three accesses (the dequantization's
  reads and write, P V's read of the V half) end, for everyone, only when a barrier instance or mbarrier
  phase completes that the warpgroup's threads arrived on after them: until then a lagging warp may still
  be in them. Everything else is one interval per warpgroup (its warps in step): in the 16-bit form races
  between the warps of one warpgroup are NOT modelled (a warp's wgmma wait covers its own rows only: that
  is what its bar_sync(W3_WG1 + w, 128) after P V is for; it stays a no-op step, and dropping it an
  ablation the model cannot judge).
Checks (a run stops at its first violation)
  race      a write while a read or another write of the part is open, or before a reader read the old
            contents; a read that finds a write in progress or another tag than expected.
  named     two instances (P_FULL of tile u, FIN of segment k, ...) pending on one id, two counts on one
            instance, arrivals beyond the count, an instance left incomplete.
  mbarrier  a wait that returns before the phase it means completed; an arrival, track or tracked landing
            counted in another phase than the one meant; a phase left half-done at the end.
  deadlock  nobody can step, no copy in flight: each actor's blocking op is printed with its kernel line.
  The instance and meant-phase checks are the intent checks (--no-intent-checks keeps only the PTX-level
  rules, the tags and deadlocks; --self-test runs both ways). Each step's kernel line is found by a chain
  of code snippets (SITES); a snippet no longer found is reported and fails --self-test.
What it does not model
  The TMA forms (fp8raw_protocol.py models the fp8 one), F8R_VT's loop, EMPTY, __syncwarp, BAR_WG0;
  addresses (the parts are disjoint, as the gathers' addresses make them: tools/models/gather_maps.py);
  proxy fences, scopes, mbarrier init and find_part (the model starts after them); the global loads
  (gather_rows, f8r_load_rope), the global epilogue and all values; timing (paces are random per run, not
  exhaustive: a finding comes with the seed and run to replay; the normal mode prints how often each wait
  had to wait); the schedule arithmetic (a CTA gets a list of segments (t0, t1), t1 > t0, that every
  actor walks).
How to run
  python3 tools/models/gather3wg_protocol.py                  # 16-bit form, 2000 random runs, seed 1
  python3 tools/models/gather3wg_protocol.py --form fp8       # the fp8 form
  python3 tools/models/gather3wg_protocol.py --runs 5000 --seed 7 --segments 3,1,2   # fixed tile counts
  python3 tools/models/gather3wg_protocol.py --bug no_track       # inject bugs (a,b: see --list-bugs)
  python3 tools/models/gather3wg_protocol.py --self-test          # the form's bugs caught, clean without
  python3 tools/models/gather3wg_protocol.py --form fp8 --self-test
  python3 tools/models/gather3wg_protocol.py --run 17 --trace 60  # replay run 17 of the seed
  python3 tools/models/gather3wg_protocol.py --defer --self-test  # the W3_CP_DEFER lab's arrival
  --list-bugs, --bug and --self-test take the selected form's bugs (some names are in both, modelled as
  each form's code has them).
  --defer models the W3_CP_DEFER lab build: a gather commits its copies without a tracked arrival; the
  thread waits for its own copies (cp_async_wait) and arrives on FULL at the next tile, before P_FULL (the
  prologue's two tiles right after it). The tracked-arrival bugs do not apply there; defer_no_wait (the
  arrival without the wait) does.
Exit status 0 when clean (--self-test: every bug caught both ways, the protocol clean), else 1.
"""

import collections
import os
import random
import re
import sys
import time

import protocol_cli
from protocol_cli import run

KERNEL = "kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh"
# Kernel lines: per modelled step a chain of snippets, each searched from the line of the one before (the
# file holds the fp8 and TMA forms too, with the same calls): the last one is the step's line.
D = "__device__ void decode_wgmma_3wg("
W12 = "const int w = wg - 1;"  # warpgroups 1 and 2's code
CPB = ("pv_tile<T, 128>(o, dp", "} else if constexpr (CP) {")  # the 16-bit gather form's branch after P V
G = "__device__ __forceinline__ void w3_gather("
GR = "__device__ __forceinline__ void w3_gather_rows("  # the row loop, flags and arrival the gathers share
GRAW = "__device__ __forceinline__ void w3_gather_raw("
DQ = "f8r_dequant_v(sRing + slot * F8R_SLOT"  # the fp8 form's dequantization in the tile loop
SITES = {
    "init.full": (D, "mbar_init(full + 8 * s, CP ? 256 : 1)"),
    "wg0.q_ready": (D, "bar_sync(W3_Q_READY, W3_THREADS)"),
    "wg0.full": (D, "mbar_wait(full + 8 * slot, (u >> 1) & 1)"),
    "wg0.qk": (D, "w3_qk16<T>(s, dq, sRing + slot * L::SLOT)"),
    "wg0.flags": (D, "const unsigned char* fl = flags_of(slot)"),
    "wg0.pfree": (D, "if (u >= 1) mbar_wait(pfree, (u - 1) & 1)"),
    "wg0.p": (D, "store_p_rows(sP, pk, wwarp, lane)"),
    "wg0.alpha": (D, "s_alpha[r_lo] = alpha[0]"),
    "wg0.p_full": (D, "bar_arrive(W3_P_FULL, W3_THREADS)"),
    "wg0.fin_store": (D, "store_fin(s_fin, l_run, m_run, r_lo, qd)"),
    "wg0.fin": (D, "bar_arrive(W3_FIN, W3_THREADS)"),
    "wg12.prologue": (D, W12, "w3_gather<T>(p, rows, sRing + v * L::SLOT"),
    "wg12.q": (D, W12, "w3_load_q_regs<T>(p, sg.b, row0, sQ"),
    "wg12.pv_pair": (D, W12, "bar_sync(W3_PV_PAIR, 256)"),
    "wg12.q_ready": (D, W12, "bar_arrive(W3_Q_READY, W3_THREADS)"),
    "wg12.full": (D, W12, "mbar_wait(full + 8 * slot, (u >> 1) & 1)"),
    "wg12.p_full": (D, W12, "bar_sync(W3_P_FULL, W3_THREADS)"),
    "wg12.alpha": (D, W12, "rescale(o, s_alpha[r_lo], s_alpha[r_lo + 8])"),
    "wg12.pv": (D, W12, "pv_tile<T, 128>(o, dp"),
    "wg12.pfree": (D, W12) + CPB + ("mbar_arrive(pfree)",),
    "wg12.wgbar": (D, W12) + CPB + ("bar_sync(W3_WG1 + w, 128)",),
    "wg12.gather": (D, W12) + CPB + ("w3_gather<T>(p, ahead, kst",),
    "wg12.fin": (D, W12, "bar_sync(W3_FIN, W3_THREADS)"),
    "wg12.store": (D, W12, "w3_store<T>(p, sg, row0, o, s_fin"),
    "gather.v": (G, "cp_async16(srow + (j >> 1) * SUB_BYTES"),
    "gather.rope": (G, "cp_async16(dst + 8 * SUB_BYTES"),
    "gather.flags": (GR, "if (sub == 0) flags[r] = ok ? 1 : 0"),
    "gather.track": (GR, "mbar_track_cp_async(full)"),
    "gather.arrive": (GR, "mbar_arrive(full);"),
    "gather.commit": (GR, "cp_async_commit();  // the caller arrives"),
    "wg12.defer_prologue": (D, W12, "if (W3_CP_DEFER && filled == 2)"),
    "wg12.defer": (D, W12, "w3_cp_arrive(full, pending)"),
    # the fp8 form's own steps (the steps above that its code shares keep their keys)
    "wg0.pinv": (D, "pinv[0] = s_pinv[r_lo]"),
    "wg0.qk8": (D, "f8r_qk(s, dq, sRing + slot * F8R_SLOT"),
    "wg12.prologue8": (D, W12, "w3_gather_raw(p, rows, sRing + v * L::SLOT"),
    "wg12.split_q": (D, W12, "f8r_split_q(p, sg.b, row0, sQ, s_pinv"),
    "split_q.pinv": ("__device__ __forceinline__ void f8r_split_q(", "if (grp == 0) s_pinv[r] ="),
    "wg12.pfree_v": (D, W12, "&& u >= 1) mbar_wait(pfree, (u - 1) & 1)"),
    "wg12.dequant": (D, W12, DQ),
    "wg12.wgbar_v": (D, W12, DQ, "bar_sync(W3_WG1 + w, 128)"),
    "wg12.pfree8": (D, W12, "pv_tile<T, 128>(o, dp", "mbar_arrive(pfree);  // P(u), its factors and the V half"),
    "wg12.gather8": (D, W12, "w3_gather_raw(p, ahead, kst"),
    "gather.code": (GRAW, "cp_async16(box + (j >> 1) * F8R_BOX"),
    "gather.rope8": (GRAW, "cp_async16(dst + 4 * F8R_BOX"),
    "gather.scales": (GRAW, "cp_async8(dst + F8R_SCALES"),
    "ce.land": None,  # the copy engine
}
LINES, MISSING_SITES = {}, []


def locate_sites():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", KERNEL)
    text = open(path, encoding="utf-8").read().split("\n") if os.path.exists(path) else []
    for key, chain in SITES.items():
        LINES[key], i = (None, chain[-1] if chain else "(the copy engine)"), 0
        for snip in chain or ():
            i = next((j for j in range(i, len(text)) if snip in text[j]), None)
            if i is None:
                MISSING_SITES.append(key)
                break
        else:
            if chain:
                LINES[key] = (i + 1, text[i].strip())


def where(site):
    ln, code = LINES.get(site, (None, site))
    return f"L{ln or '?'}: {code}"


def lineno(site):
    return LINES.get(site, (None, ""))[0] or "?"


# ---------------------------------------------------------------------------------------------
THREADS, SLOTS, W = 384, 2, 128  # W3_THREADS, W3_SLOTS, an actor's weight in threads
P_FULL, Q_READY, FIN, WGBAR, PV_PAIR = 1, 2, 3, 4, 6  # W3_P_FULL, ..., W3_WG1 (+ 1: WG2), W3_PV_PAIR
BAR_NAMES = {1: "P_FULL", 2: "Q_READY", 3: "FIN", 4: "WG1", 5: "WG2", 6: "PV_PAIR"}
SLOT_PARTS = {"V1": "WG1", "V2": "WG2", "R1": "WG1", "R2": "WG2"}  # part of a slot -> whose gather copies it
SLOT_PARTS8 = {"C0": "WG1", "C1": "WG1", "C2": "WG2", "C3": "WG2", "R1": "WG1", "R2": "WG2", "S1": "WG1", "S2": "WG2"}
FORM = "16"  # the form modelled: "16" or "fp8" (--form)

# Injected bugs: name -> (what, sites). --self-test expects each caught with and without the intent checks.
BUGS_16 = {
    "full_count_128": ("FULL initialised with count 128 instead of 256", ["init.full"]),
    "no_track": ("no mbar_track_cp_async before the arrive on FULL (copies may land later)", ["gather.track"]),
    "arrive_before_track": ("the arrive on FULL before the track", ["gather.arrive", "gather.track"]),
    "track_noinc": ("the track with .noinc (the landing counts as one more arrival)", ["gather.track"]),
    "gather_before_pv": ("WG1/WG2 gather tile u + 2 right after the FULL wait, before P V(u) read their V half",
                         ["wg12.gather", "wg12.full"]),
    "pfree_before_pv": ("WG1/WG2 arrive on P_FREE before rescale and P V read s_alpha, P", ["wg12.pfree", "wg12.pv"]),
    "flags_after_arrive": ("WG1 writes the tile's flags after its arrive on FULL", ["gather.flags"]),
    "no_pfree_wait": ("WG0 does not wait on P_FREE before writing P(u)", ["wg0.pfree"]),
    "full_parity_off": ("every FULL wait uses parity ((u >> 1) + 1) & 1", ["wg0.full", "wg12.full"]),
    "gather_other_slot": ("the refill goes into slot (u + 1) & 1 (its flags and FULL too)", ["wg12.gather"]),
    "no_full_wait_wg0": ("WG0 does not wait on FULL before S", ["wg0.full"]),
    "no_q_ready_sync": ("WG0 does not bar_sync(Q_READY)", ["wg0.q_ready"]),
    "q_ready_before_q": ("WG1/WG2 arrive on Q_READY before writing Q", ["wg12.q_ready", "wg12.q"]),
    "fin_before_store": ("WG0 arrives on FIN before store_fin writes s_fin", ["wg0.fin", "wg0.fin_store"]),
    "no_fin_sync": ("WG1/WG2 read s_fin without bar_sync(FIN)", ["wg12.fin"]),
    "prologue_one_tile": ("the prologue gathers only the first tile", ["wg12.prologue"]),
}
# Removals the model finds nothing against: information on what it cannot see, not advice.
ABLATIONS_16 = {
    "no_wg_bar": ("drop bar_sync(W3_WG1 + w, 128) after P V (between warps: not modelled)", ["wg12.wgbar"]),
    "no_pv_pair": ("drop bar_sync(W3_PV_PAIR, 256) (racecheck's; the arrives order for the model)", ["wg12.pv_pair"]),
    "no_full_wait_wg12": ("drop WG1/WG2's FULL wait (P_FULL(u) follows WG0's wait on the same phase; proxy fences "
                          "and the memory model are not modelled)", ["wg12.full"]),
}
# The fp8 form's: the 16-bit form's that its code shares (some placed or worded for its code), then its own.
_F8_SITES = {"wg0.qk": "wg0.qk8", "wg12.q": "wg12.split_q", "wg12.prologue": "wg12.prologue8",
             "wg12.gather": "wg12.gather8", "wg12.pfree": "wg12.pfree8"}
BUGS_FP8 = {name: (what, [_F8_SITES.get(x, x) for x in sites]) for name, (what, sites) in BUGS_16.items()}
BUGS_FP8.update({
    "gather_before_pv": ("WG1/WG2 gather tile u + 2 right after the FULL wait, before their dequantization and "
                         "WG0's S(u) read the slot", ["wg12.gather8", "wg12.full"]),
    "pfree_before_pv": ("WG1/WG2 arrive on P_FREE before rescale and P V read s_alpha, P and their V half",
                        ["wg12.pfree8", "wg12.pv"]),
    "no_q_ready_sync": ("WG0 does not bar_sync(Q_READY) (reads s_pinv, then S reads Q)", ["wg0.q_ready"]),
    "q_ready_before_q": ("WG1/WG2 arrive on Q_READY before f8r_split_q writes Q and s_pinv",
                         ["wg12.q_ready", "wg12.split_q"]),
    "gather_before_p_full": ("WG1/WG2 gather tile u + 2 right after the dequantization's barrier, before "
                             "P_FULL(u) (WG0's S(u) may still read the slot)", ["wg12.gather8", "wg12.wgbar_v"]),
    "no_pfree_wait_v": ("WG1/WG2 do not wait on P_FREE(u - 1) before the dequantization writes their V half "
                        "(a lagging warp's P V(u - 1) may still read it)", ["wg12.pfree_v", "wg12.dequant"]),
    "no_full_wait_wg12": ("WG1/WG2 do not wait on FULL before the dequantization reads the slot",
                          ["wg12.full", "wg12.dequant"]),
})
ABLATIONS_FP8 = {
    "no_wg_bar": ("drop bar_sync(W3_WG1 + w, 128) after the dequantization (P_FULL's bar_sync, which the "
                  "warpgroup's threads also join after it, orders the V half before P V and the slot's reads "
                  "before the gather; the proxy fence's publication to wgmma is not modelled)", ["wg12.wgbar_v"]),
    "no_pv_pair": ABLATIONS_16["no_pv_pair"],
    "gather_other_groups": ("warpgroup w copies the other warpgroup's code groups C{2(1 - w)}, C{2(1 - w) + 1} "
                            "(each dequantization still reads its own): every read of tile u's slot (S(u), "
                            "both dequantizations) precedes P_FULL(u), which every gather of tile u + 2 "
                            "follows, so who copies a part does not matter to the hand-overs",
                            ["gather.code", "wg12.dequant"]),
    "wg_bar_not_pfree": ("instead of waiting on P_FREE(u - 1) before the dequantization, bar_sync(W3_WG1 + w, "
                         "128) after P V(u - 1) (the 16-bit form's order): the warpgroup's own warps, not the "
                         "other warpgroup, are what its V half waits for", ["wg12.pfree_v", "wg12.pfree8"]),
}
# --defer: the tracked arrival's bugs do not exist there; its own.
_NOT_DEFER = ("no_track", "arrive_before_track", "track_noinc", "flags_after_arrive")
BUGS_DEFER = {"defer_no_wait": ("the deferred arrival on FULL without waiting for the thread's own copies "
                                "(cp_async_wait)", ["wg12.defer"])}
DEFER = False  # --defer
BUGS, ABLATIONS = dict(BUGS_16), dict(ABLATIONS_16)  # the selected form's (configure())
WAITS_16 = ["wg0.q_ready", "wg0.full", "wg0.pfree", "wg12.pv_pair", "wg12.full", "wg12.p_full", "wg12.fin"]
WAITS_FP8 = ["wg0.q_ready", "wg0.full", "wg0.pfree", "wg12.pv_pair", "wg12.full", "wg12.pfree_v", "wg12.p_full",
             "wg12.fin"]
WAITS = list(WAITS_16)


class Violation(Exception):
    def __init__(self, kind, msg):
        super().__init__(msg)
        self.kind, self.msg = kind, msg


def tagstr(tag):
    return "nothing" if tag is None else f"seg {tag[0]}" if len(tag) == 1 else f"seg {tag[0]} tile {tag[1]}"


class MBar:
    """phase: completed phases (current parity: phase & 1); pending: arrivals and tracks still owed."""

    def __init__(self, name, count, intent):
        self.name, self.count, self.intent = name, count, intent
        self.pending, self.phase, self.tracked = count, 0, 0

    def _check(self, meant, who, site, what):
        if self.intent and meant != self.phase:
            raise Violation("mbarrier", f"{who}'s {what} on {self.name} meant for phase {meant} counts in phase "
                            f"{self.phase} ({where(site)})")

    def arrive(self, n, meant, who, site, what="arrival"):
        """Returns the phase the last of the n arrivals counted in."""
        last = self.phase
        while n > 0:  # a warpgroup's 128 arrivals are 128 threads': those beyond the count go to the next phase
            self._check(meant, who, site, what)
            last = self.phase
            take = min(n, self.pending)
            self.pending -= take
            n -= take
            if self.pending == 0:
                self.phase, self.pending = self.phase + 1, self.count
        return last

    def track(self, n, meant, who, site):  # cp.async.mbarrier.arrive without .noinc: the count is raised now
        self._check(meant, who, site, "track")
        self.pending += n
        self.tracked += n

    def __str__(self):
        return (f"{self.name}: {self.phase} phases done (parity {self.phase & 1}), pending {self.pending} of "
                f"{self.count}" + (f" ({self.tracked} for copies in flight)" if self.tracked else ""))


class NamedBar:
    def __init__(self, bid, intent):
        self.bid, self.intent, self.name = bid, intent, BAR_NAMES[bid]
        self.count, self.arrived, self.labels, self.gen = None, 0, collections.Counter(), 0

    def arrive(self, n, label, who, site):
        """Adds one actor's 128 threads; returns the instance (generation) arrived on."""
        bar = f"{self.bid} ({self.name})"
        if self.count is not None and self.count != n:
            raise Violation("named", f"{who} arrives on {bar} with count {n}, its pending instance has {self.count} "
                            f"({where(site)})")
        if self.intent and self.labels and label not in self.labels:
            raise Violation("named", f"{who} arrives on {bar} for {label} while arrivals for {dict(self.labels)} "
                            f"are pending: two instances on one id ({where(site)})")
        self.count, self.arrived, gen = n, self.arrived + W, self.gen
        self.labels[label] += W
        if self.arrived > n:
            raise Violation("named", f"{who} brings {bar} to {self.arrived} arrivals, beyond {n} ({where(site)})")
        if self.arrived == n:
            self.gen, self.count, self.arrived, self.labels = gen + 1, None, 0, collections.Counter()
        return gen

    def __str__(self):
        return f"{self.bid} {self.name}: {self.arrived}/{self.count} arrived for {dict(self.labels)}"


class Part:
    def __init__(self):
        self.tag = self.writing = None  # the contents' tag; the tag of a write in progress
        self.pending = collections.Counter()  # reader -> reads owed to the current contents
        self.open = collections.Counter()  # reader -> open read intervals
        self.lag = collections.Counter()  # fp8: who -> its reads / write here that a warp may still be in


class Op:
    def __init__(self, kind, site, **kw):
        self.kind, self.site, self.arrived, self.blocked, self.warp = kind, site, False, False, False
        self.__dict__.update(kw)  # warp: an end that lags in some warp until a barrier (fp8: Sim.lag)

    def describe(self):
        k, o = self.kind, self
        if k == "mwait":
            return f"mbar_wait({o.bar.name}, parity {o.parity}) meaning phase {o.meant}"
        if k == "cpwait":
            return "cp_async_wait<0>() (its copies landed)"
        if k in ("marrive", "track"):
            return f"{'mbar_arrive' if k == 'marrive' else 'mbar_track_cp_async'}({o.bar.name}) for phase {o.meant}"
        if k in ("barrive", "bsync"):  # bar_arrive / bar_sync
            return f"bar_{k[1:]}({o.bar.bid} {o.bar.name}, {o.n}) for {o.label}" + (" [arrived]" if o.arrived else "")
        lag = " (a warp's: ends at a barrier all its threads join after it)" if o.warp else ""
        if k in ("rbegin", "rend"):
            return ("read " if k == "rbegin" else "end read ") + ", ".join(
                f"{b}{'[' + ','.join(ps) + ']' if ps else ''} ({tagstr(t)})" for b, ps, t in o.reads) + lag
        what = dict(wbegin='write', wend='end write', copy='cp.async into')[k]
        return f"{what} {o.buf}[{o.part}] ({tagstr(o.tag)})" + lag


class Actor:  # a warpgroup: gen its program, op the step it is at, ctx where it is (for the reports)
    def __init__(self, name):
        self.name, self.gen, self.op, self.ctx = name, None, None, ""
        self.deferred = []  # --defer: (FULL, phase) arrivals owed for copies committed


# ---------------------------------------------------------------------------------------------
class Sim:
    def __init__(self, segs, bugs, intent=True, form=None):
        self.segs, self.B, self.intent, self.f8 = segs, set(bugs), intent, (form or FORM) == "fp8"
        self.tiles = [(k, t) for k, (t0, t1) in enumerate(segs) for t in range(t0, t1)]  # the CTA's walk
        self.full = [MBar(f"FULL[{s}]", 128 if "full_count_128" in self.B else 256, intent) for s in range(SLOTS)]
        self.pfree = MBar("P_FREE", 256, intent)
        self.mbars = self.full + [self.pfree]
        self.nbars = {b: NamedBar(b, intent) for b in BAR_NAMES}
        self.bufs = {f"slot[{s}]": {p: Part() for p in (SLOT_PARTS8 if self.f8 else SLOT_PARTS)} for s in range(SLOTS)}
        self.bufs.update({f"flags[{s}]": {"WG1": Part()} for s in range(SLOTS)})
        self.bufs["Q"] = {"WG1": Part(), "WG2": Part()}  # w3_load_q_regs / f8r_split_q: WG1 and WG2 a share each
        self.bufs.update({b: {"WG0": Part()} for b in ("P", "s_alpha", "s_fin")})
        if self.f8:
            self.bufs["s_pinv"] = {"WG1": Part(), "WG2": Part()}  # f8r_split_q: rows 0..31 / 32..63
            self.bufs["V"] = {"V1": Part(), "V2": Part()}  # the V stage's halves (f8r_dequant_v)
        self.lagging = []  # fp8: [who, ("r", reads) | ("w", buf, part), [(barrier, instance) joined since]]
        self.copies, self.ncopies = {}, 0  # id -> (actor, buf, part, tag): issued, not landed
        self.tracks = collections.defaultdict(list)  # actor -> [(bar, meant, copy ids it waits for, who)]
        self.blocked_waits = collections.Counter()  # site -> waits that did not return at once
        self.trace = collections.deque(maxlen=400)
        self.actors = [Actor(n) for n in ("WG0", "WG1", "WG2")]
        for w, a in enumerate(self.actors):
            a.gen = self.prog_wg0(a) if w == 0 else self.prog_wg12(a, w - 1)
            a.op = next(a.gen, None)

    def readers(self, buf, part, tag):
        """Who must read a write of buf[part], how often, before it may be overwritten."""
        if buf.startswith("slot") and self.f8:  # S reads the whole slot; warpgroup w's dequantization its
            i = int(part[1:])  # code groups C{2w}, C{2w + 1} and their scales S{w + 1}
            if part[0] == "R":
                return {"WG0": 1}
            return {"WG0": 1, f"WG{i // 2 + 1 if part[0] == 'C' else i}": 1}
        if buf.startswith("slot"):  # S reads the whole slot; P V(u) of warpgroup w its V half
            return {"WG0": 1, SLOT_PARTS[part]: 1} if part[0] == "V" else {"WG0": 1}
        if buf == "V":  # the warpgroup's P V
            return {f"WG{part[1]}": 1}
        if buf == "s_pinv":
            return {"WG0": 1}
        if buf.startswith("flags"):
            return {"WG0": 1}
        if buf == "Q":  # S of every tile of the segment
            return {"WG0": self.segs[tag[0]][1] - self.segs[tag[0]][0]}
        return {"WG1": 1, "WG2": 1}  # P, s_alpha, s_fin

    # -- buffer accesses ------------------------------------------------------------------
    @staticmethod
    def lagnote(p):
        return (f" (a warp of {', '.join(+p.lag)} may still be in it: no barrier instance or phase that all its "
                "threads joined after it has completed)") if +p.lag else ""

    def wbegin(self, who, buf, part, tag, site):
        p, loc = self.bufs[buf][part], f"{buf}[{part}] ({tagstr(tag)})"
        if p.writing is not None:
            raise Violation("race", f"{who} starts writing {loc} while {tagstr(p.writing)} is still being written "
                            f"into it{self.lagnote(p)} ({where(site)})")
        if +p.open:
            raise Violation("race", f"{who} starts writing {loc} while {', '.join(+p.open)} still read(s) its "
                            f"{tagstr(p.tag)}{self.lagnote(p)} ({where(site)})")
        if +p.pending:
            raise Violation("race", f"{who} overwrites {loc} holding {tagstr(p.tag)} before " + ", ".join(
                f"{r} read it ({n} read(s) owed)" for r, n in (+p.pending).items()) + f" ({where(site)})")
        p.writing, p.pending = tag, collections.Counter(self.readers(buf, part, tag))

    def wend(self, buf, part):
        p = self.bufs[buf][part]
        p.tag, p.writing = p.writing, None

    def rbegin(self, who, reads, site):
        for buf, ps, tag in reads:  # ps: the parts read (None: all)
            for name in ps or self.bufs[buf]:
                p, loc = self.bufs[buf][name], f"{buf}[{name}] expecting {tagstr(tag)}"
                if p.writing is not None:
                    raise Violation("race", f"{who} reads {loc} while {tagstr(p.writing)} is still being written "
                                    f"into it{self.lagnote(p)} ({where(site)})")
                if p.tag != tag:
                    raise Violation("race", f"{who} reads {loc} but it holds {tagstr(p.tag)} ({where(site)})")
                if p.pending[who] <= 0:
                    raise Violation("race", f"{who} reads {loc} more often than the model expects ({where(site)})")
                p.open[who] += 1

    def rend(self, who, reads):  # (a write that starts during the read is caught at its start)
        for buf, ps, tag in reads:
            for name in ps or self.bufs[buf]:
                self.bufs[buf][name].open[who] -= 1
                self.bufs[buf][name].pending[who] -= 1

    # fp8: the end of an access a warp of the warpgroup may lag in (see the docstring). Each barrier instance
    # or mbarrier phase `who` arrives on after it is recorded; the first of them to complete ends it.
    def lag(self, who, item):
        self.lagging.append([who, item, []])
        for p in self.lag_parts(item):
            p.lag[who] += 1

    def lag_parts(self, item):
        if item[0] == "w":
            return [self.bufs[item[1]][item[2]]]
        return [self.bufs[buf][name] for buf, ps, _ in item[1] for name in ps or self.bufs[buf]]

    def joined(self, who, bar, instance):
        for lg in self.lagging:
            if lg[0] == who:
                lg[2].append((bar, instance))

    def settle(self):
        keep = []
        for who, item, joins in self.lagging:
            if not any((b.phase if isinstance(b, MBar) else b.gen) > i for b, i in joins):
                keep.append([who, item, joins])
                continue
            for p in self.lag_parts(item):
                p.lag[who] -= 1
            if item[0] == "r":
                self.rend(who, item[1])
            else:
                self.wend(item[1], item[2])
            self.trace.append((who, "", "lag", f"its warps' {self.lagdesc(item)} done (a barrier they joined "
                               "completed)"))
        self.lagging = keep

    @staticmethod
    def lagdesc(item):
        if item[0] == "w":
            return f"write of {item[1]}[{item[2]}]"
        return "reads of " + ", ".join(f"{b}[{','.join(ps)}]" if ps else b for b, ps, _ in item[1])

    # -- programs -----------------------------------------------------------------------------
    def read(self, reads, site):
        yield Op("rbegin", site, reads=reads)
        yield Op("rend", site, reads=reads)

    def write(self, buf, part, tag, site):
        yield Op("wbegin", site, buf=buf, part=part, tag=tag)
        yield Op("wend", site, buf=buf, part=part, tag=tag)

    def full_wait(self, u, site):
        par = (((u >> 1) + 1) if "full_parity_off" in self.B else (u >> 1)) & 1
        return Op("mwait", site, bar=self.full[u & 1], parity=par, meant=u >> 1)

    def prog_wg0(self, me):
        B, u = self.B, 0
        for k, (t0, t1) in enumerate(self.segs):
            me.ctx = f"seg {k}"
            if "no_q_ready_sync" not in B:
                yield Op("bsync", "wg0.q_ready", bar=self.nbars[Q_READY], n=THREADS, label=("Q_READY", k))
            if self.f8:  # pinv[] = s_pinv[r_lo], [r_lo + 8]
                yield from self.read([("s_pinv", None, (k,))], "wg0.pinv")
            for t in range(t0, t1):
                slot, me.ctx = u & 1, f"seg {k} tile {t} u={u}"
                if "no_full_wait_wg0" not in B:
                    yield self.full_wait(u, "wg0.full")
                qk = "wg0.qk8" if self.f8 else "wg0.qk"  # f8r_qk: the codes, rope and scales; w3_qk16
                yield from self.read([(f"slot[{slot}]", None, (k, t)), ("Q", None, (k,))], qk)
                yield from self.read([(f"flags[{slot}]", None, (k, t))], "wg0.flags")  # the softmax's masks
                if u >= 1 and "no_pfree_wait" not in B:  # WG1 and WG2 are done with P(u - 1)
                    yield Op("mwait", "wg0.pfree", bar=self.pfree, parity=(u - 1) & 1, meant=u - 1)
                yield from self.write("P", "WG0", (k, t), "wg0.p")
                yield from self.write("s_alpha", "WG0", (k, t), "wg0.alpha")
                yield Op("barrive", "wg0.p_full", bar=self.nbars[P_FULL], n=THREADS, label=("P_FULL", u))
                u += 1
            me.ctx = f"seg {k} end"
            fin = Op("barrive", "wg0.fin", bar=self.nbars[FIN], n=THREADS, label=("FIN", k))
            if "fin_before_store" in B:
                yield fin
            yield from self.write("s_fin", "WG0", (k,), "wg0.fin_store")
            if "fin_before_store" not in B:
                yield fin
        me.ctx = "returned"

    def gather(self, me, w, n, slot, site):
        """w3_gather of walk tile n into `slot`, called at `site`: its FULL phase is fill n >> 1."""
        B, tag, meant, full = self.B, self.tiles[n], n >> 1, self.full[slot]
        ctx, me.ctx = me.ctx, f"{me.ctx} (L{lineno(site)}: gathering {tagstr(tag)} into slot {slot})"
        if self.f8:  # w3_gather_raw: code groups 2w, 2w + 1, the rope's half, the two groups' scales
            cw = 1 - w if "gather_other_groups" in B else w
            for g in (2 * cw, 2 * cw + 1):
                yield Op("copy", "gather.code", buf=f"slot[{slot}]", part=f"C{g}", tag=tag)
            yield Op("copy", "gather.rope8", buf=f"slot[{slot}]", part=f"R{w + 1}", tag=tag)
            yield Op("copy", "gather.scales", buf=f"slot[{slot}]", part=f"S{w + 1}", tag=tag)
        else:
            yield Op("copy", "gather.v", buf=f"slot[{slot}]", part=f"V{w + 1}", tag=tag)
            yield Op("copy", "gather.rope", buf=f"slot[{slot}]", part=f"R{w + 1}", tag=tag)
        flags = list(self.write(f"flags[{slot}]", "WG1", tag, "gather.flags")) if w == 0 else []
        if DEFER:  # cp_async_commit; the arrival comes later (arrive_deferred)
            yield from flags
            me.deferred.append((full, meant))
            me.ctx = ctx
            return
        if "flags_after_arrive" not in B:  # plain stores: published by the arrive that follows them
            yield from flags
        track = Op("track", "gather.track", bar=full, meant=meant)
        arrive = Op("marrive", "gather.arrive", bar=full, meant=meant)
        order = [arrive, track] if "arrive_before_track" in B else [track, arrive]
        yield from (op for op in order if op is not track or "no_track" not in B)
        if "flags_after_arrive" in B:
            yield from flags
        me.ctx = ctx

    def arrive_deferred(self, me, site):
        """--defer: wait for this thread's copies, then the arrivals owed for them (w3_cp_arrive; the
        prologue's two tiles: cp_async_wait<1>, arrive, cp_async_wait<0>, arrive, modelled as one wait)."""
        if me.deferred:
            if "defer_no_wait" not in self.B:
                yield Op("cpwait", site)
            for bar, meant in me.deferred:
                yield Op("marrive", site, bar=bar, meant=meant)
            me.deferred = []

    def prog_wg12(self, me, w):
        B, u, n, f8 = self.B, 0, 0, self.f8  # n: the walk's next tile (every thread walks the CTA's tiles)
        gsite = "wg12.gather8" if f8 else "wg12.gather"
        me.ctx = "prologue"
        while n < (1 if "prologue_one_tile" in B else SLOTS) and n < len(self.tiles):
            yield from self.gather(me, w, n, n, "wg12.prologue8" if f8 else "wg12.prologue")
            n += 1
        yield from self.arrive_deferred(me, "wg12.defer_prologue")
        for k, (t0, t1) in enumerate(self.segs):
            me.ctx = f"seg {k}"
            qr = Op("barrive", "wg12.q_ready", bar=self.nbars[Q_READY], n=THREADS, label=("Q_READY", k))
            if "q_ready_before_q" in B:
                yield qr
            if f8:  # f8r_split_q: Q's hi / lo parts and s_pinv
                yield from self.write("Q", me.name, (k,), "wg12.split_q")
                yield from self.write("s_pinv", me.name, (k,), "split_q.pinv")
            else:
                yield from self.write("Q", me.name, (k,), "wg12.q")
            if "no_pv_pair" not in B:
                yield Op("bsync", "wg12.pv_pair", bar=self.nbars[PV_PAIR], n=256, label=("PV_PAIR", k))
            if "q_ready_before_q" not in B:
                yield qr
            for t in range(t0, t1):
                slot, me.ctx = u & 1, f"seg {k} tile {t} u={u}"
                dst = slot ^ 1 if "gather_other_slot" in B else slot
                if "no_full_wait_wg12" not in B:
                    yield self.full_wait(u, "wg12.full")
                if "gather_before_pv" in B and n < len(self.tiles):
                    yield from self.gather(me, w, n, dst, gsite)
                    n += 1
                if f8:
                    yield from self.dequant(w, u, (k, t), slot)
                    if "gather_before_p_full" in B and n < len(self.tiles):
                        yield from self.gather(me, w, n, dst, gsite)
                        n += 1
                yield from self.arrive_deferred(me, "wg12.defer")  # tile u + 1's copies
                yield Op("bsync", "wg12.p_full", bar=self.nbars[P_FULL], n=THREADS, label=("P_FULL", u))
                pf = Op("marrive", "wg12.pfree8" if f8 else "wg12.pfree", bar=self.pfree, meant=u)
                if "pfree_before_pv" in B:
                    yield pf
                yield from self.read([("s_alpha", None, (k, t))], "wg12.alpha")
                if f8:  # P V reads P and the V half (each warp all of its rows)
                    half = [("V", [f"V{w + 1}"], (k, t))]
                    yield Op("rbegin", "wg12.pv", reads=[("P", None, (k, t))] + half)
                    yield Op("rend", "wg12.pv", reads=[("P", None, (k, t))])
                    yield Op("rend", "wg12.pv", reads=half, warp=True)
                else:
                    yield from self.read([("P", None, (k, t)), (f"slot[{slot}]", [f"V{w + 1}"], (k, t))], "wg12.pv")
                if "pfree_before_pv" not in B:
                    yield pf
                if f8 and "wg_bar_not_pfree" in B:  # (an alternative: the warpgroup's warps done with V)
                    yield Op("bsync", "wg12.pfree8", bar=self.nbars[WGBAR + w], n=128, label=(f"WG{w + 1}", u, "PV"))
                if not f8 and "no_wg_bar" not in B:  # (a no-op for a one-actor warpgroup: see the docstring)
                    yield Op("bsync", "wg12.wgbar", bar=self.nbars[WGBAR + w], n=128, label=(f"WG{w + 1}", u))
                if "gather_before_pv" not in B and "gather_before_p_full" not in B and n < len(self.tiles):
                    yield from self.gather(me, w, n, dst, gsite)  # walk.next(): tile u + 2
                    n += 1
                u += 1
            me.ctx = f"seg {k} end"
            if "no_fin_sync" not in B:
                yield Op("bsync", "wg12.fin", bar=self.nbars[FIN], n=THREADS, label=("FIN", k))
            yield from self.read([("s_fin", None, (k,))], "wg12.store")
        me.ctx = "returned"

    def dequant(self, w, u, tag, slot):
        """fp8: warpgroup w's P_FREE(u - 1) wait, f8r_dequant_v (its code groups and scales of the slot into its
        V half; each warp its own 16 tokens) and the barrier of its threads after it."""
        if u >= 1 and "no_pfree_wait_v" not in self.B and "wg_bar_not_pfree" not in self.B:
            yield Op("mwait", "wg12.pfree_v", bar=self.pfree, parity=(u - 1) & 1, meant=u - 1)
        own = [(f"slot[{slot}]", [f"C{2 * w}", f"C{2 * w + 1}", f"S{w + 1}"], tag)]
        yield Op("rbegin", "wg12.dequant", reads=own)
        yield Op("wbegin", "wg12.dequant", buf="V", part=f"V{w + 1}", tag=tag)
        yield Op("rend", "wg12.dequant", reads=own, warp=True)
        yield Op("wend", "wg12.dequant", buf="V", part=f"V{w + 1}", tag=tag, warp=True)
        if "no_wg_bar" not in self.B:
            yield Op("bsync", "wg12.wgbar_v", bar=self.nbars[WGBAR + w], n=128, label=(f"WG{w + 1}", u))

    # -- scheduling ---------------------------------------------------------------------------
    def enabled(self, a):
        op = a.op
        if op.kind == "mwait":  # try_wait.parity returns once the current phase's parity differs
            return (op.bar.phase & 1) != op.parity
        if op.kind == "cpwait":  # cp.async.wait_group 0: this actor's copies have all landed
            return not any(c[0] == a.name for c in self.copies.values())
        return op.kind != "bsync" or not op.arrived or op.bar.gen > op.gen

    def step(self, a):
        op, k, who = a.op, a.op.kind, f"{a.name} ({a.ctx})"
        desc = op.describe()
        if k == "mwait" or (k == "bsync" and op.arrived):
            desc = desc.replace(" [arrived]", "") + " -> passes"
            self.blocked_waits[op.site] += op.blocked
        self.trace.append((a.name, a.ctx, op.site, desc))
        advance = True
        if k == "mwait" and self.intent and op.bar.phase <= op.meant:
            raise Violation("mbarrier", f"{who}: mbar_wait({op.bar.name}, parity {op.parity}) returns before phase "
                            f"{op.meant} has completed ({op.bar.phase} phases done) ({where(op.site)})")
        elif k == "marrive":
            ph = op.bar.arrive(W, op.meant, who, op.site)
            if self.lagging:
                self.joined(a.name, op.bar, ph)
        elif k == "track":  # waits for all of this actor's copies in flight, whichever slot they go to
            ids = {i for i, c in self.copies.items() if c[0] == a.name}
            if "track_noinc" not in self.B:
                op.bar.track(W, op.meant, who, op.site)
            self.tracks[a.name].append((op.bar, op.meant, ids, who))
            self.fire_tracks(a.name)
        elif k == "barrive":
            gen = op.bar.arrive(op.n, op.label, who, op.site)
            if self.lagging:
                self.joined(a.name, op.bar, gen)
        elif k == "bsync" and not op.arrived:
            op.gen, op.arrived, advance = op.bar.arrive(op.n, op.label, who, op.site), True, False
            if self.lagging:
                self.joined(a.name, op.bar, op.gen)
        elif k == "rbegin":
            self.rbegin(a.name, op.reads, op.site)
        elif k == "rend" and op.warp:
            self.lag(a.name, ("r", op.reads))
        elif k == "rend":
            self.rend(a.name, op.reads)
        elif k == "wbegin":
            self.wbegin(a.name, op.buf, op.part, op.tag, op.site)
        elif k == "wend" and op.warp:
            self.lag(a.name, ("w", op.buf, op.part))
        elif k == "wend":
            self.wend(op.buf, op.part)
        elif k == "copy":  # the write interval runs until the copy engine lands the batch
            self.wbegin(f"{a.name}'s cp.async", op.buf, op.part, op.tag, op.site)
            self.copies[self.ncopies] = (a.name, op.buf, op.part, op.tag)
            self.ncopies += 1
        if self.lagging:
            self.settle()
        if advance:
            a.op = next(a.gen, None)

    def fire_tracks(self, actor):
        """Tracked arrivals whose copies have all landed now lower their phase's pending count."""
        keep = []
        for bar, meant, ids, who in self.tracks[actor]:
            if ids & self.copies.keys():
                keep.append((bar, meant, ids, who))
                continue
            bar.tracked -= 0 if "track_noinc" in self.B else W
            bar.arrive(W, meant, who, "gather.track", "tracked copies' arrival")
        self.tracks[actor] = keep

    def land(self, cid):
        actor, buf, part, tag = self.copies.pop(cid)
        self.trace.append(("CE", "", "ce.land", f"{actor}'s copy of {tagstr(tag)} into {buf}[{part}] lands"))
        self.wend(buf, part)
        self.fire_tracks(actor)
        if self.lagging:
            self.settle()

    def final_checks(self):
        if self.lagging:
            who, item, _ = self.lagging[0]
            raise Violation("race", f"at the end: {who}'s warps' {self.lagdesc(item)} never followed by a completed "
                            "barrier all its threads joined")
        left = [f"barrier {nb}" for nb in self.nbars.values() if nb.count is not None]
        left += [f"{mb} (a phase half-done)" for mb in self.mbars if mb.pending != mb.count or mb.tracked]
        if left:
            raise Violation("named" if left[0].startswith("barrier") else "mbarrier", "at the end: " + left[0])
        for buf, parts in self.bufs.items():
            for name, p in parts.items():
                if +p.pending:
                    raise Violation("race", f"at the end: {buf}[{name}] holds {tagstr(p.tag)} that "
                                    f"{dict(+p.pending)} never read")

    def state(self):
        out = ["  actors:"]
        for a in self.actors:
            if a.op is None:
                out.append(f"    {a.name} done ({a.ctx})")
                continue
            b = a.op.bar if a.op.kind == "mwait" else None
            extra = f"  [{b.name}: {b.phase} phases done, parity {b.phase & 1}]" if b else ""
            out.append(f"    {a.name} {'ready  ' if self.enabled(a) else 'blocked'} {a.ctx}: {a.op.describe()} at "
                       f"{where(a.op.site)}{extra}")
        pend = "; ".join(str(n) for n in self.nbars.values() if n.count is not None)
        fly = ", ".join(f"{c[0]}: {c[1]}[{c[2]}] {tagstr(c[3])}" for c in self.copies.values())
        out += ["  mbarriers: " + "; ".join(str(m) for m in self.mbars),
                "  named barriers: " + (pend or "no arrivals pending"), "  copies in flight: " + (fly or "none")]
        return "\n".join(out)


def run_once(segs, bugs, rng, intent=True, max_steps=200000):
    """One random interleaving: ('ok' | 'violation' | 'deadlock', (Violation or None, sim, steps))."""
    sim = Sim(segs, bugs, intent)
    speeds = [rng.choice((0.03, 0.3, 1.0, 1.0, 4.0)) for _ in range(4)]  # WG0, WG1, WG2, the copy engine
    steps = 0
    try:
        while steps < max_steps:
            steps += 1
            if rng.random() < 0.02:  # now and then one actor (or the copy engine) changes its pace
                speeds[rng.randrange(4)] = rng.choice((0.03, 0.3, 1.0, 4.0))
            live = [a for a in sim.actors if a.op is not None]
            for a in live:
                a.op.blocked |= not sim.enabled(a)
            cand = [(a, speeds[i]) for i, a in enumerate(sim.actors) if a.op is not None and sim.enabled(a)]
            cand += [(None, speeds[3])] if sim.copies else []
            if not cand:
                if not live:
                    sim.final_checks()
                    return "ok", (None, sim, steps)
                stuck = ", ".join(f"{a.name} at L{lineno(a.op.site)}" for a in live)
                return "deadlock", (Violation("deadlock", f"no actor can step: {stuck}"), sim, steps)
            a = rng.choices([c[0] for c in cand], [c[1] for c in cand])[0]
            if a is None:
                sim.land(rng.choice(list(sim.copies)))
            else:
                sim.step(a)
        return "violation", (Violation("livelock", f"no end after {max_steps} steps"), sim, steps)
    except Violation as v:
        return "violation", (v, sim, steps)


# ---------------------------------------------------------------------------------------------
FIXED_CASES = [("zero segments", []), ("one segment of one tile", [(0, 1)]),
               ("many one-tile segments", [(0, 1)] * 12), ("many two-tile segments", [(0, 2)] * 7),
               ("three short segments", [(0, 3), (0, 1), (0, 2)]), ("one tile mid-sequence", [(5, 6)]),
               ("one long segment", [(2, 19)]), ("odd lengths", [(1, 4), (0, 1), (0, 5), (0, 2), (0, 1)])]


def case_for(run, seed, fixed_segs):
    rng = random.Random(f"{seed}:{run}")
    if fixed_segs is not None:
        return rng, "given segments", fixed_segs
    if run < len(FIXED_CASES):
        return (rng,) + FIXED_CASES[run]
    r, n = rng.random(), rng.randint(1, 5)
    if r < 0.25:
        return rng, "many short segments", [(0, rng.choice((1, 1, 1, 2, 3))) for _ in range(3 * n)]
    t0 = rng.randint(0, 4)
    if r < 0.35:
        return rng, "one long segment", [(t0, t0 + rng.randint(2, 16))]
    return rng, "random segments", [(t0 if i == 0 else 0, (t0 if i == 0 else 0) + rng.randint(1, 6)) for i in range(n)]


def report(run, seed, cname, segs, bugs, res, v, sim, ntrace):
    form = " --form fp8" if FORM == "fp8" else ""
    print(f"\n=== run {run} (replay:{form} --seed {seed} --run {run}" + (f" --bug {','.join(bugs)}" if bugs else "")
          + f"): {res.upper()}, kind {v.kind}\n  segments ({cname}): {segs}\n  {v.msg}\n{sim.state()}")
    if ntrace:
        print(f"  last {min(ntrace, len(sim.trace))} steps:")
        for who, ctx, site, desc in list(sim.trace)[-ntrace:]:
            print(f"    {who:3s} {ctx:40s} {'L' + str(lineno(site)) if SITES.get(site) else '-':5s} {desc}")


def explore(runs, seed, bugs, fixed_segs=None, only_run=None, ntrace=12, quiet=False, intent=True):
    st = {"runs": 0, "caught": 0, "first": None, "steps": 0, "tiles": 0}
    for c in ("kinds", "cases", "msgs", "blocked"):
        st[c] = collections.Counter()
    reported = 0
    for run in (range(runs) if only_run is None else [only_run]):
        rng, cname, segs = case_for(run, seed, fixed_segs)
        res, (v, sim, steps) = run_once(segs, bugs, rng, intent)
        st["runs"], st["steps"] = st["runs"] + 1, st["steps"] + steps
        st["tiles"] += sum(t1 - t0 for t0, t1 in segs)
        st["cases"][cname] += 1
        st["blocked"].update(sim.blocked_waits)
        if res == "ok":
            continue
        st["caught"] += 1
        st["kinds"][v.kind] += 1
        key = v.msg if v.kind == "deadlock" else re.sub(r"\d+", "#", v.msg.split(" (L")[0])
        st["msgs"][key] += 1
        st["first"] = st["first"] or (run, v)
        if not quiet and reported < 3 and st["msgs"][key] == 1:
            report(run, seed, cname, segs, bugs, res, v, sim, ntrace)
            reported += 1
    return st


def self_test(seed, runs):
    t0, ok = time.time(), True
    kinds = lambda s: ", ".join(f"{k} {n}" for k, n in s["kinds"].most_common())  # noqa: E731
    print(f"self-test of the {'fp8' if FORM == 'fp8' else '16-bit'} gather form: the unmodified protocol, then each "
          f"injected bug, {runs} runs each (seed {seed});\n"
          "  'plain': the same runs without the intent checks (PTX-level barrier rules, data tags, deadlocks)")
    for intent in (True, False):
        st = explore(max(runs, 500), seed, [], quiet=True, intent=intent)
        ok &= st["caught"] == 0
        print(f"  {'(none: the kernel as written)':26s} {st['caught']:4d}/{st['runs']} runs flagged"
              f"{'' if intent else ' (plain)'}  -> {'clean' if st['caught'] == 0 else 'VIOLATIONS'}")
    for name, (what, sites) in list(BUGS.items()) + list(ABLATIONS.items()):
        if name == next(iter(ABLATIONS)):
            print("  removals the model finds nothing against (information, not part of the verdict):")
        st = explore(runs, seed, [name], quiet=True)
        line = f"  {name:26s} {st['caught']:4d}/{st['runs']} flagged [{kinds(st)}]"
        if name in BUGS:
            pl = explore(runs, seed, [name], quiet=True, intent=False)
            caught = st["caught"] > 0 and pl["caught"] > 0
            ok &= caught
            line += f"; plain {pl['caught']}/{pl['runs']} [{kinds(pl)}]  -> {'CAUGHT' if caught else 'MISSED'}"
        print(f"{line}\n      {what} ({','.join(f'L{lineno(s)}' for s in sites)})")
        if st["first"]:
            print(f"      e.g. run {st['first'][0]}: {st['first'][1].kind}: {st['first'][1].msg}")
    print(f"self-test {'PASSED' if ok else 'FAILED'} in {time.time() - t0:.1f} s")
    return ok


def configure(args):
    """--form: the form modelled, its bugs, ablations and reported waits; --defer: the W3_CP_DEFER lab."""
    global FORM, DEFER
    FORM, DEFER = args.form, args.defer
    for active, table in ((BUGS, BUGS_FP8), (ABLATIONS, ABLATIONS_FP8)) if FORM == "fp8" else \
            ((BUGS, BUGS_16), (ABLATIONS, ABLATIONS_16)):
        active.clear()
        active.update(table)
    if DEFER:
        for name in _NOT_DEFER:
            del BUGS[name]
        BUGS.update(BUGS_DEFER)
        if FORM == "fp8":  # the copies a warpgroup's dequantization reads are its own, waited for at the
            # deferred arrival a tile earlier; the other warps' rows of them are not modelled
            what, sites = BUGS.pop("no_full_wait_wg12")
            ABLATIONS["no_full_wait_wg12"] = (what + " (--defer: its own copies were waited for a tile earlier; "
                                              "between warps: not modelled)", sites)
    WAITS[:] = WAITS_FP8 if FORM == "fp8" else WAITS_16


def main():
    form = (["--form"], dict(choices=("16", "fp8"), default="16",
                             help="the gather form modelled: 16 (16-bit, RAW = false; the default) or fp8 "
                                  "(fp8_ds_mla, RAW = true); --list-bugs, --bug, --self-test take its bugs"))
    defer = (["--defer"], dict(action="store_true",
                               help="model the W3_CP_DEFER lab build (the arrival one tile after the copies)"))
    return protocol_cli.main(__doc__, KERNEL, locate_sites, MISSING_SITES, BUGS, ABLATIONS, where, self_test,
                             explore, WAITS, options=[form, defer], configure=configure)


if __name__ == "__main__":
    run(main)
