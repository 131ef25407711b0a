#!/usr/bin/env python3
"""Executable model of the synchronization protocol of the gather forms (CP) of the three-warpgroup MLA
decode kernel (kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh: decode_wgmma_3wg<T, RAW, true>),
explored over random interleavings to find deadlocks and shared-memory races before the kernel runs on a
GPU. --form 16 (the default): the 16-bit form (RAW = false: w3_gather, w3_load_q_regs); --form fp8: the
fp8_ds_mla form (RAW = true: w3_gather_raw, f8r_split_q, f8r_qk, f8r_dequant_v; the default loop, not
F8R_VT's f8r_vt_loop). Standard library only (Python 3.11); the conventions of
tools/models/fp8raw_protocol.py (the fp8 TMA form's model); the machinery of protocol_sim.py (barriers,
race bookkeeping, scheduler, reports, self-test) and the command line of protocol_cli.py.

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

import protocol_cli
import protocol_sim
from protocol_cli import run
from protocol_sim import (MBar, NamedBar, Part, SimBase, Violation, actor_lines, barrier_lines, begin_read, begin_write,
                          check_wait, end_checks, end_read, end_write, explore_segments, fixed_cases, record_step,
                          run_once)

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
    "init.full": (D, "mbar_init(full + L::FULL_STRIDE * s + 8 * cb, CP ? 256 : 1)"),
    "wg0.q_ready": (D, "bar_sync(W3_Q_READY, W3_THREADS)"),
    "wg0.full": (D, "mbar_wait(full + L::FULL_STRIDE * slot, L::phase(u))"),
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
    "wg12.full": (D, W12, "mbar_wait(full + L::FULL_STRIDE * slot, L::phase(u))"),
    "wg12.p_full": (D, W12, "bar_sync(W3_P_FULL, W3_THREADS)"),
    "wg12.alpha": (D, W12, "rescale(o, s_alpha[r_lo], s_alpha[r_lo + 8])"),
    "wg12.pv": (D, W12, "pv_tile<T, 128>(o, dp"),
    "wg12.pfree": (D, W12) + CPB + ("mbar_arrive(pfree)",),
    "wg12.wgbar": (D, W12) + CPB + ("bar_sync(W3_WG1 + w, 128)",),
    "wg12.gather": (D, W12) + CPB + ("w3_gather<T>(p, ahead, kst",),
    "wg12.fin": (D, W12, "bar_sync(W3_FIN, W3_THREADS)"),
    "wg12.store": (D, W12, "w3_store<T>(p, sg, row0, o, fin,"),
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
S = protocol_sim.Sites({"": KERNEL}, {k: ("", chain, 0) if chain else None for k, chain in SITES.items()},
                      "(the copy engine)")
locate_sites, MISSING_SITES, where, lineno = S.locate, S.missing, S.where, S.line


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


def tagstr(tag):
    return "nothing" if tag is None else f"seg {tag[0]}" if len(tag) == 1 else f"seg {tag[0]} tile {tag[1]}"


protocol_sim.bind(S, tagstr)


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
class Sim(SimBase):
    def __init__(self, segs, bugs, intent=True, form=None):
        self.segs, self.B, self.intent, self.f8 = segs, set(bugs), intent, (form or FORM) == "fp8"
        self.tiles = [(k, t) for k, (t0, t1) in enumerate(segs) for t in range(t0, t1)]  # the CTA's walk
        self.full = [MBar(f"FULL[{s}]", 128 if "full_count_128" in self.B else 256, intent) for s in range(SLOTS)]
        self.pfree = MBar("P_FREE", 256, intent)
        self.mbars = self.full + [self.pfree]
        self.nbars = {b: NamedBar(BAR_NAMES[b], intent, bid=b) for b in BAR_NAMES}
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
        p = self.bufs[buf][part]
        begin_write(p, f"{buf}[{part}]", who, tag, self.readers(buf, part, tag), site, self.lagnote(p))

    def wend(self, buf, part):
        end_write(self.bufs[buf][part])

    def rbegin(self, who, reads, site):
        for buf, ps, tag in reads:  # ps: the parts read (None: all)
            for name in ps or self.bufs[buf]:
                p = self.bufs[buf][name]
                begin_read(p, f"{buf}[{name}]", who, tag, site, self.lagnote(p))

    def rend(self, who, reads):  # (a write that starts during the read is caught at its start)
        for buf, ps, tag in reads:
            for name in ps or self.bufs[buf]:
                end_read(self.bufs[buf][name], who)

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
        ctx, me.ctx = me.ctx, f"{me.ctx} ({lineno(site)}: gathering {tagstr(tag)} into slot {slot})"
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
        if a.op.kind == "cpwait":  # cp.async.wait_group 0: this actor's copies have all landed
            return not any(c[0] == a.name for c in self.copies.values())
        return SimBase.enabled(self, a)

    def step(self, a):
        op, k, who = a.op, a.op.kind, f"{a.name} ({a.ctx})"
        record_step(op, self.trace, self.blocked_waits, a.name, a.ctx)
        advance = True
        if k == "mwait":
            check_wait(op, who, self.intent)
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
            gen = op.bar.arrive(op.n, W, op.label, who, op.site)
            if self.lagging:
                self.joined(a.name, op.bar, gen)
        elif k == "bsync" and not op.arrived:
            op.gen, op.arrived, advance = op.bar.arrive(op.n, W, op.label, who, op.site), True, False
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

    def engine(self):
        return self.copies

    def engine_step(self, ev, i):
        self.land(list(ev)[i])

    def final_checks(self):
        if self.lagging:
            who, item, _ = self.lagging[0]
            raise Violation("race", f"at the end: {who}'s warps' {self.lagdesc(item)} never followed by a completed "
                            "barrier all its threads joined")
        end_checks(self.mbars, self.nbars.values(),
                   [(f"{buf}[{name}]", p) for buf, parts in self.bufs.items() for name, p in parts.items()])

    def state(self):
        fly = ", ".join(f"{c[0]}: {c[1]}[{c[2]}] {tagstr(c[3])}" for c in self.copies.values())
        return "\n".join(actor_lines(self) + barrier_lines(self.mbars, self.nbars.values())
                         + ["  copies in flight: " + (fly or "none")])


# ---------------------------------------------------------------------------------------------
FIXED_CASES = fixed_cases(12, 7, 19)


def random_segments(rng):
    r, n = rng.random(), rng.randint(1, 5)
    if r < 0.25:
        return "many short segments", [(0, rng.choice((1, 1, 1, 2, 3))) for _ in range(3 * n)]
    t0 = rng.randint(0, 4)
    if r < 0.35:
        return "one long segment", [(t0, t0 + rng.randint(2, 16))]
    return "random segments", [(t0 if i == 0 else 0, (t0 if i == 0 else 0) + rng.randint(1, 6)) for i in range(n)]


def explore(runs, seed, bugs, fixed_segs=None, only_run=None, ntrace=12, quiet=False, max_reports=3, intent=True,
            stop_after=None):
    """The random runs (protocol_sim.explore's statistics)."""
    replay = (("--form fp8 " if FORM == "fp8" else "") + ("--defer " if DEFER else "")
              + ("" if intent else "--no-intent-checks "))
    return explore_segments(runs, seed, bugs, fixed_segs, only_run, ntrace, quiet, max_reports, stop_after, FIXED_CASES,
                            random_segments,
                            lambda segs, rng: run_once(Sim(segs, bugs, intent), rng, 200000, draw_always=True),
                            replay, (3, 40, 5))


def self_test(seed, runs):
    return protocol_sim.self_test(explore, BUGS, ABLATIONS, seed, runs, 26, 500,
                                  title=f" of the {'fp8' if FORM == 'fp8' else '16-bit'} gather form")


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
