#!/usr/bin/env python3
"""Executable model of the synchronization protocol of `decode_wgmma_fp8r`
(kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh, its fp8 form), explored over random interleavings
to find deadlocks and shared-memory races before the kernel runs on a GPU. Standard library
only (Python 3.11).

What it models
--------------
Actors (each a generator that steps through the kernel's code, one synchronization or
shared-memory access per step; a step is atomic):
  WG0  warpgroup 0 (128 threads): per segment bar_sync(Q_READY), s_pinv; per tile
       mbar_wait(FULL), S (the slot and Q read by wgmma until wgmma_wait<0>), nvalid,
       mbar_arrive(EMPTY), mbar_wait(P_FREE) (u >= 1), P and s_alpha, bar_arrive(P_FULL);
       s_fin, bar_arrive(FIN).
  ISS  thread 128 (lane 0 of warp 4), the issuing lane: all of warpgroup 1's code with weight 1,
       plus its own TileWalk, the two prologue loads and, per tile, walk.next(),
       mbar_wait(EMPTY) and w3_issue (nvalid, expect_tx, six TMA boxes).
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
  python3 tools/models/fp8raw_protocol.py                 # 2000 random runs, seed 1
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
import os
import random
import re
import sys
import time

import protocol_cli
from protocol_cli import run

KERNEL = "kernels-cuda/mla_decode_attention/wgmma_3wg_sm90.cuh"

# ---------------------------------------------------------------------------------------------
# Kernel lines: a snippet of the code (and which occurrence) for every modeled step.
SITES = {
    "wg0.q_ready": ("bar_sync(W3_Q_READY, W3_THREADS)", 0),
    "wg0.pinv": ("pinv[0] = s_pinv[r_lo]", 0),
    "wg0.full": ("mbar_wait(full + 8 * slot, (u >> 1) & 1)", 1),
    "wg0.qk": ("f8r_qk(s, dq, sRing + slot * F8R_SLOT", 0),
    "wg0.nvalid": ("const int nv = nvalid[slot]", 0),
    "wg0.empty": ("mbar_arrive(empty + 8 * slot)", 1),
    "wg0.pfree": ("if (u >= 1) mbar_wait(pfree, (u - 1) & 1)", 0),
    "wg0.p": ("store_p_rows(sP, pk, wwarp, lane)", 0),
    "wg0.alpha": ("s_alpha[r_lo] = alpha[0]", 0),
    "wg0.p_full": ("bar_arrive(W3_P_FULL, W3_THREADS)", 0),
    "wg0.fin_store": ("store_fin(s_fin, l_run, m_run, r_lo, qd)", 0),
    "wg0.fin": ("bar_arrive(W3_FIN, W3_THREADS)", 0),
    "iss.prologue": ("w3_issue<RAW>(p, walk, sRing + v * L::SLOT", 0),
    "issue.nvalid": ("*nvalid = ok ? min(BN, w.sg.len - j) : 0", 0),
    "issue.expect": ("mbar_expect_tx(full, ", 0),
    "issue.code": ("tma_load_3d(dst + g * F8R_BOX", 0),
    "issue.rope": ("tma_load_3d(dst + 4 * F8R_BOX", 0),
    "issue.scales": ("tma_load_3d(dst + F8R_SCALES", 0),
    "wg12.syncwarp0": ("__syncwarp();", 1),
    "wg12.split_q": ("f8r_split_q(p, sg.b, row0, sQ, s_pinv, threadIdx.x - 128)", 0),
    "wg12.q_ready": ("bar_arrive(W3_Q_READY, W3_THREADS)", 1),
    "wg12.full": ("mbar_wait(full + 8 * slot, (u >> 1) & 1)", 2),
    "wg12.pfree": ("u >= 1) mbar_wait(pfree, (u - 1) & 1)", 1),
    "wg12.dequant": ("f8r_dequant_v(sRing + slot * F8R_SLOT", 0),
    "wg12.empty": ("mbar_arrive(empty + 8 * slot)", 2),
    "wg12.wgbar": ("bar_sync(W3_WG1 + w, 128)", 1),
    "iss.empty": ("mbar_wait(empty + 8 * slot, (u >> 1) & 1)", 0),
    "iss.issue": ("w3_refill<RAW>(issuer, walk, p, part, u, sRing + slot * F8R_SLOT", 0),
    "wg12.syncwarp1": ("__syncwarp();", 0),
    "wg12.p_full": ("bar_sync(W3_P_FULL, W3_THREADS)", 1),
    "wg12.alpha": ("rescale(o, s_alpha[r_lo], s_alpha[r_lo + 8])", 0),
    "wg12.pv": ("pv_tile<T, 128>(o, dp, RAW ? dv", 0),
    "wg12.pfree_arrive": ("mbar_arrive(pfree)", 1),
    "wg12.fin": ("bar_sync(W3_FIN, W3_THREADS)", 1),
    "wg12.store": ("w3_store<T>(p, sg, row0, o, s_fin", 0),
    "tma.land": (None, 0),
}
LINES = {}  # site -> (line number or None, code text)
MISSING_SITES = []


def locate_sites():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.normpath(os.path.join(here, "..", "..", KERNEL))
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read().split("\n")
    except OSError:
        text = None
    for key, (snip, nth) in SITES.items():
        LINES[key] = (None, snip or "(the copy engine)")
        if snip is None or text is None:
            if snip is not None:
                MISSING_SITES.append(key)
            continue
        seen = 0
        for i, line in enumerate(text):
            if snip in line:
                if seen == nth:
                    LINES[key] = (i + 1, line.strip())
                    break
                seen += 1
        else:
            MISSING_SITES.append(key)


def where(site):
    ln, code = LINES.get(site, (None, site))
    return f"L{ln if ln else '?'}: {code}"


def lineno(site):
    return LINES.get(site, (None, ""))[0] or "?"


# ---------------------------------------------------------------------------------------------
# Constants of the kernel.
THREADS = 384  # W3_THREADS
SLOTS = 2  # F8R_SLOTS
BOX = 64 * 128  # F8R_BOX
BOXES = [("code group 0", BOX, "issue.code"), ("code group 1", BOX, "issue.code"),
         ("code group 2", BOX, "issue.code"), ("code group 3", BOX, "issue.code"),
         ("rope", BOX, "issue.rope"), ("scales", 64 * 16, "issue.scales")]
SLOT_BYTES = 5 * BOX + 64 * 16  # F8R_SLOT = 41984
assert SLOT_BYTES == sum(b for _, b, _ in BOXES) == 41984
P_FULL, Q_READY, FIN, WGBAR = 1, 2, 3, 4  # W3_P_FULL, W3_Q_READY, W3_FIN, W3_WG1 (+1: WG2)
BAR_NAMES = {1: "P_FULL", 2: "Q_READY", 3: "FIN", 4: "WG1", 5: "WG2", "warp4": "__syncwarp(warp 4)"}

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
# Removals the model finds no violation for (shown by --self-test as information). Not advice to
# remove them: the model ignores convergence (bar.sync is bar.sync.aligned: warp 4 must be
# converged, which the __syncwarp after the issuing lane's branch provides) and proxy fences.
ABLATIONS = {
    "no_wg_bar": ("drop bar_sync(W3_WG1 + w, 128) (the V half's barrier)", ["wg12.wgbar"]),
    "no_syncwarp": ("drop both __syncwarp() (warp 4 no longer waits for the issuing lane; still needed "
                    "for the convergence bar.sync.aligned requires, which the model does not check)",
                    ["wg12.syncwarp0", "wg12.syncwarp1"]),
}


# ---------------------------------------------------------------------------------------------
class Violation(Exception):
    def __init__(self, kind, msg):
        super().__init__(msg)
        self.kind, self.msg = kind, msg


def tagstr(tag):
    if tag is None:
        return "nothing (never written)"
    if len(tag) == 1:
        return f"seg {tag[0]}"
    return f"seg {tag[0]} tile {tag[1]}"


class MBar:
    """An mbarrier: phase = number of completed phases (current parity = phase & 1)."""

    def __init__(self, name, count, intent=True):
        self.name, self.count, self.intent = name, count, intent
        self.pending, self.tx, self.phase = count, 0, 0

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, n, meant, who, site):
        while n > 0:
            if self.pending == 0:
                raise Violation("mbarrier", f"{who} arrives on {self.name} beyond its count {self.count} while "
                                f"phase {self.phase} still waits for {self.tx} bytes ({where(site)})")
            if self.intent and meant is not None and meant != self.phase:
                raise Violation("mbarrier", f"{who}'s arrival on {self.name} meant for phase {meant} counts in "
                                f"phase {self.phase} ({where(site)})")
            take = min(n, self.pending)
            self.pending -= take
            n -= take
            self._complete()

    def expect_tx(self, nbytes, meant, who, site):
        self.tx += nbytes
        self.arrive(1, meant, who, site)

    def complete_tx(self, nbytes, meant, what):
        if self.intent and meant is not None and meant != self.phase:
            raise Violation("mbarrier", f"{what}: its bytes on {self.name} meant for phase {meant} land in phase "
                            f"{self.phase}")
        self.tx -= nbytes
        self._complete()

    def __str__(self):
        return (f"{self.name}: {self.phase} phases done (parity {self.phase & 1}), "
                f"{self.count - self.pending}/{self.count} arrived, tx {self.tx}")


class NamedBar:
    def __init__(self, bid, intent=True):
        self.bid, self.intent = bid, intent
        self.name = BAR_NAMES[bid]
        self.count, self.arrived, self.labels, self.gen = None, 0, collections.Counter(), 0

    def arrive(self, n, w, label, who, site):
        """Adds w arrivals; returns the generation (instance number) arrived on."""
        if self.count is None:
            self.count = n
        elif self.count != n:
            raise Violation("named", f"{who} arrives on barrier {self.bid} ({self.name}) with count {n} while the "
                            f"pending instance has count {self.count} ({where(site)})")
        if self.intent and label is not None and self.labels and label not in self.labels:
            raise Violation("named", f"{who} arrives on barrier {self.bid} ({self.name}) for {label} while "
                            f"arrivals for {dict(self.labels)} are pending: two instances on one id "
                            f"({where(site)})")
        self.arrived += w
        self.labels[label] += w
        gen = self.gen
        if self.arrived > self.count:
            raise Violation("named", f"{who} brings barrier {self.bid} ({self.name}) to {self.arrived} arrivals, "
                            f"beyond its count {self.count} ({dict(self.labels)}) ({where(site)})")
        if self.arrived == self.count:
            self.gen += 1
            self.count, self.arrived, self.labels = None, 0, collections.Counter()
        return gen

    def __str__(self):
        if self.count is None:
            return f"{self.bid} {self.name}: idle ({self.gen} instances completed)"
        return (f"{self.bid} {self.name}: {self.arrived}/{self.count} arrived for {dict(self.labels)} "
                f"({self.gen} instances completed)")


class Part:
    __slots__ = ("tag", "writing", "pending", "open")

    def __init__(self):
        self.tag, self.writing = None, None
        self.pending = collections.Counter()  # reader -> reads still owed to the current contents
        self.open = collections.Counter()  # reader -> open read intervals


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
        self.n = -1  # tiles issued so far - 1: the fill count (slot n & 1, phase n >> 1)

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
class Sim:
    def __init__(self, segs, bugs, rng, intent=True):
        self.segs, self.bugs, self.rng, self.intent = segs, set(bugs), rng, intent
        self.full = [MBar(f"FULL[{s}]", 1, intent) for s in range(SLOTS)]
        self.empty = [MBar(f"EMPTY[{s}]", THREADS, intent) for s in range(SLOTS)]
        self.pfree = MBar("P_FREE", 256, intent)
        self.mbars = self.full + self.empty + [self.pfree]
        self.nbars = {b: NamedBar(b, intent) for b in (1, 2, 3, 4, 5, "warp4")}
        self.bufs = {}
        for s in range(SLOTS):
            self.bufs[f"ring[{s}]"] = Buf(f"ring[{s}]", ["TMA"])
            self.bufs[f"nvalid[{s}]"] = Buf(f"nvalid[{s}]", ["ISS"])
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
            a.gen = self.prog_wg0(a) if wg == 0 else self.prog_wg12(a)
            a.op = next(a.gen, None)
            self.actors.append(a)

    # Who must read a write, how often, before it may be overwritten.
    def readers(self, buf, tag):
        if buf.startswith("ring") or buf.startswith("nvalid"):
            return {a: 1 for a in CONSUMERS}
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
        p = self.bufs[bufname].parts[part]
        loc = f"{bufname}[{part}]" if len(self.bufs[bufname].parts) > 1 else bufname
        if p.writing is not None:
            raise Violation("race", f"{who} starts writing {loc} ({tagstr(tag)}) while {tagstr(p.writing)} is "
                            f"still being written into it ({where(site)})")
        opened = {r: n for r, n in p.open.items() if n}
        if opened:
            raise Violation("race", f"{who} starts writing {loc} ({tagstr(tag)}) while {', '.join(opened)} "
                            f"still read(s) its {tagstr(p.tag)} ({where(site)})")
        owed = {r: n for r, n in p.pending.items() if n}
        if owed:
            raise Violation("race", f"{who} overwrites {loc} holding {tagstr(p.tag)} with {tagstr(tag)} before "
                            + ", ".join(f"{r} read it ({n} read(s) owed)" for r, n in owed.items())
                            + f" ({where(site)})")
        p.writing = tag
        p.pending = collections.Counter(self.readers(bufname, tag))

    def wend(self, bufname, part):
        p = self.bufs[bufname].parts[part]
        p.tag, p.writing = p.writing, None

    def rbegin(self, who, reads, site):
        for bufname, tag in reads:
            buf = self.bufs[bufname]
            for pname, p in buf.parts.items():
                loc = f"{bufname}[{pname}]" if len(buf.parts) > 1 else bufname
                if p.writing is not None:
                    raise Violation("race", f"{who} reads {loc} expecting {tagstr(tag)} while {pname} is still "
                                    f"writing {tagstr(p.writing)} into it ({where(site)})")
                if p.tag != tag:
                    raise Violation("race", f"{who} reads {loc} expecting {tagstr(tag)} but it holds "
                                    f"{tagstr(p.tag)} ({where(site)})")
                if p.pending[who] <= 0:
                    raise Violation("race", f"{who} reads {loc} ({tagstr(tag)}) more often than the model "
                                    f"expects ({where(site)})")
                p.open[who] += 1

    def rend(self, who, reads, site):
        for bufname, tag in reads:
            for p in self.bufs[bufname].parts.values():
                if p.tag != tag or p.writing is not None:  # (a write start would have been caught)
                    raise Violation("race", f"{who}'s read of {bufname} ({tagstr(tag)}) saw it change "
                                    f"({where(site)})")
                p.open[who] -= 1
                p.pending[who] -= 1

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
                slot = u & 1
                me.ctx = f"seg {k} tile {t} u={u}"
                par = (((t - t0) >> 1) & 1) if "full_parity_local" in B else ((u >> 1) & 1)
                yield Op("mwait", "wg0.full", bar=self.full[slot], parity=par, meant=u >> 1)
                empty = Op("marrive", "wg0.empty", bar=self.empty[slot], meant=u >> 1)
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

    def issue(self, me, walk, slot, site):
        """w3_issue<true>, called at `site`."""
        tag, meant = (walk.k, walk.t), walk.n >> 1
        assert walk.n & 1 == slot
        ctx = me.ctx
        me.ctx = f"{ctx} (L{lineno(site)}: issuing {tagstr(tag)})"
        yield from self.write(f"nvalid[{slot}]", tag, "issue.nvalid")
        nbytes = SLOT_BYTES - (64 * 16 if "short_tx" in self.bugs else 0)
        yield Op("expect_tx", "issue.expect", bar=self.full[slot], nbytes=nbytes, meant=meant)
        for i, (what, nb, s) in enumerate(BOXES):
            yield Op("tma", s, slot=slot, box=i, nbytes=nb, tag=tag, meant=meant, what=what)
        me.ctx = ctx

    def prog_wg12(self, me):
        B = self.bugs
        w = me.wg - 1
        vbuf = f"V[wg{me.wg}]"
        u = 0
        walk = TileWalk(self.segs) if me.issuer else None
        if me.issuer:
            me.ctx = "prologue"
            v = 0
            while v < SLOTS and walk.next():
                yield from self.issue(me, walk, v, "iss.prologue")
                v += 1
        if me.warp4 and "no_syncwarp" not in B:
            yield Op("bsync", "wg12.syncwarp0", bar=self.nbars["warp4"], n=32, label=None)
        for k, (t0, t1) in enumerate(self.segs):
            me.ctx = f"seg {k}"
            qr = Op("barrive", "wg12.q_ready", bar=self.nbars[Q_READY], n=THREADS, label=("Q_READY", k))
            if "q_ready_before_split" in B:
                yield qr
            yield Op("wbegin", "wg12.split_q", buf="Q", tag=(k,))
            yield Op("wbegin", "wg12.split_q", buf="s_pinv", tag=(k,))
            yield Op("wend", "wg12.split_q", buf="Q", tag=(k,))
            yield Op("wend", "wg12.split_q", buf="s_pinv", tag=(k,))
            if "q_ready_before_split" not in B:
                yield qr
            for t in range(t0, t1):
                slot = u & 1
                me.ctx = f"seg {k} tile {t} u={u}"
                par = (((t - t0) >> 1) & 1) if "full_parity_local" in B else ((u >> 1) & 1)
                yield Op("mwait", "wg12.full", bar=self.full[slot], parity=par, meant=u >> 1)
                if u >= 1 and "no_pfree_wait_v" not in B:
                    yield Op("mwait", "wg12.pfree", bar=self.pfree, parity=(u - 1) & 1, meant=u - 1)
                yield from self.read([(f"nvalid[{slot}]", (k, t))], "wg12.dequant")  # the argument
                yield Op("rbegin", "wg12.dequant", reads=[(f"ring[{slot}]", (k, t))])
                yield Op("wbegin", "wg12.dequant", buf=vbuf, tag=(k, t))
                yield Op("wend", "wg12.dequant", buf=vbuf, tag=(k, t))
                yield Op("rend", "wg12.dequant", reads=[(f"ring[{slot}]", (k, t))])
                yield Op("marrive", "wg12.empty", bar=self.empty[slot], meant=u >> 1)
                if "no_wg_bar" not in B:
                    yield Op("bsync", "wg12.wgbar", bar=self.nbars[WGBAR + w], n=128, label=(f"WG{me.wg}", u))
                if me.issuer and walk.next():
                    if "no_empty_wait" not in B:
                        yield Op("mwait", "iss.empty", bar=self.empty[slot], parity=(u >> 1) & 1, meant=u >> 1)
                    yield from self.issue(me, walk, slot, "iss.issue")
                if me.warp4 and "no_syncwarp" not in B:
                    yield Op("bsync", "wg12.syncwarp1", bar=self.nbars["warp4"], n=32, label=None)
                yield Op("bsync", "wg12.p_full", bar=self.nbars[P_FULL], n=THREADS, label=("P_FULL", u))
                pf = Op("marrive", "wg12.pfree_arrive", bar=self.pfree, meant=u)
                if "pfree_before_pv" in B:
                    yield pf
                yield from self.read([("s_alpha", (k, t))], "wg12.alpha")
                yield from self.read([("P", (k, t)), (vbuf, (k, t))], "wg12.pv")
                if "pfree_before_pv" not in B:
                    yield pf
                u += 1
            me.ctx = f"seg {k} end"
            if "no_fin_sync" not in B:
                yield Op("bsync", "wg12.fin", bar=self.nbars[FIN], n=THREADS, label=("FIN", k))
            yield from self.read([("s_fin", (k,))], "wg12.store")
        me.ctx = "returned"

    # -- scheduling -------------------------------------------------------------------------
    def enabled(self, a):
        op = a.op
        if op.kind == "mwait":
            return (op.bar.phase & 1) != op.parity
        if op.kind == "bsync":
            return not op.arrived or op.bar.gen > op.gen
        return True

    def step(self, a):
        op = a.op
        k = op.kind
        desc = op.describe()
        if k == "mwait" or (k == "bsync" and op.arrived):
            desc = desc.replace(" [arrived, waiting]", "") + " -> passes"
            if op.blocked:
                self.blocked_waits[op.site] += 1
        self.trace.append((a.name, a.ctx, op.site, desc))
        advance = True
        if k == "mwait":
            if self.intent and op.meant is not None and op.bar.phase <= op.meant:
                raise Violation("mbarrier", f"{a.name} ({a.ctx}): mbar_wait({op.bar.name}, parity {op.parity}) "
                                f"returns before phase {op.meant} has completed ({op.bar.phase} phases done) "
                                f"({where(op.site)})")
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

    def final_checks(self):
        for nb in self.nbars.values():
            if nb.count is not None:
                raise Violation("named", f"at the end: barrier {nb}")
        for mb in self.mbars:
            if mb.pending != mb.count or mb.tx != 0:
                raise Violation("mbarrier", f"at the end: {mb} (a phase left half-done)")
        for buf in self.bufs.values():
            for pname, p in buf.parts.items():
                owed = {r: n for r, n in p.pending.items() if n}
                if owed:
                    raise Violation("race", f"at the end: {buf.name}[{pname}] holds {tagstr(p.tag)} that "
                                    f"{owed} never read")

    def state(self):
        out = ["  actors:"]
        for a in self.actors:
            if a.op is None:
                out.append(f"    {a.name:4s} done ({a.ctx})")
            else:
                blocked = "blocked" if not self.enabled(a) else "ready  "
                extra = ""
                if a.op.kind == "mwait":
                    b = a.op.bar
                    extra = f"  [{b.name} at {b.phase} phases done, parity {b.phase & 1}]"
                    if b.phase > a.op.meant and not self.enabled(a):
                        extra += (f" <- phase {a.op.meant} has completed, but parity {a.op.parity} is the "
                                  f"current phase's ({b.phase}): the wait cannot return")
                out.append(f"    {a.name:4s} {blocked} {a.ctx}: {a.op.describe()} at {where(a.op.site)}{extra}")
        out.append("  mbarriers: " + "; ".join(str(m) for m in self.mbars))
        out.append("  named barriers: " + ("; ".join(str(n) for n in self.nbars.values() if n.count is not None)
                                           or "no arrivals pending"))
        out.append("  TMA in flight: " + (", ".join(f"slot {s} box {BOXES[b][0]} ({tagstr(t)})"
                                                    for s, b, _, t, _ in self.tma) or "none"))
        return "\n".join(out)


def run_once(segs, bugs, rng, intent=True, max_steps=200000):
    """One random interleaving. Returns (result, info): result 'ok' / 'violation' / 'deadlock'."""
    sim = Sim(segs, bugs, rng, intent)
    actors = sim.actors
    speeds = [rng.choice((0.03, 0.3, 1.0, 1.0, 4.0)) for _ in range(len(actors) + 1)]  # last: TMA
    steps = 0
    try:
        while True:
            steps += 1
            if steps > max_steps:
                return "violation", (Violation("livelock", f"no end after {max_steps} steps"), sim, steps)
            if rng.random() < 0.02:  # now and then, one actor changes its pace
                speeds[rng.randrange(len(speeds))] = rng.choice((0.03, 0.3, 1.0, 4.0))
            cand, wts = [], []
            for i, a in enumerate(actors):
                if a.op is not None:
                    if sim.enabled(a):
                        cand.append(a)
                        wts.append(speeds[i])
                    else:
                        a.op.blocked = True
            if sim.tma:
                cand.append(None)
                wts.append(speeds[-1])
            if not cand:
                if all(a.op is None for a in actors):
                    sim.final_checks()
                    return "ok", (None, sim, steps)
                stuck = ", ".join(f"{a.name} at L{lineno(a.op.site)}" for a in actors if a.op is not None)
                return "deadlock", (Violation("deadlock", f"no actor can step: {stuck}"), sim, steps)
            a = rng.choices(cand, wts)[0] if len(cand) > 1 else cand[0]
            if a is None:
                sim.tma_step(rng.randrange(len(sim.tma)))
            else:
                sim.step(a)
    except Violation as v:
        return "violation", (v, sim, steps)


# ---------------------------------------------------------------------------------------------
FIXED_CASES = [
    ("zero segments", []),
    ("one segment of one tile", [(0, 1)]),
    ("many one-tile segments", [(0, 1)] * 12),
    ("many two-tile segments", [(0, 2)] * 7),
    ("three short segments", [(0, 3), (0, 1), (0, 2)]),
    ("one tile mid-sequence", [(5, 6)]),
    ("one long segment", [(2, 19)]),
    ("odd lengths", [(1, 4), (0, 1), (0, 5), (0, 2), (0, 1)]),
]


def random_segments(rng):
    r = rng.random()
    if r < 0.04:
        return "zero segments", []
    if r < 0.08:
        return "one segment of one tile", [(0, 1)]
    if r < 0.30:
        n = rng.randint(4, 14)
        return "many short segments", [(0, rng.choice((1, 1, 1, 2, 3))) for _ in range(n)]
    if r < 0.40:
        t0 = rng.randint(0, 4)
        return "one long segment", [(t0, t0 + rng.randint(2, 16))]
    n = rng.randint(1, 5)
    segs = []
    for i in range(n):
        t0 = rng.randint(0, 3) if i == 0 else 0
        segs.append((t0, t0 + rng.randint(1, 6)))
    return "random segments", segs


def case_for(run, seed, fixed_segs):
    rng = random.Random(f"{seed}:{run}")
    if fixed_segs is not None:
        return rng, "given segments", fixed_segs
    if run < len(FIXED_CASES):
        name, segs = FIXED_CASES[run]
        return rng, name, segs
    name, segs = random_segments(rng)
    return rng, name, segs


def report(run, seed, cname, segs, bugs, res, v, sim, steps, ntrace):
    print(f"\n=== run {run} (seed {seed}, replay: --seed {seed} --run {run}"
          + (f" --bug {','.join(bugs)}" if bugs else "") + f"): {res.upper()}, kind {v.kind}")
    print(f"  segments ({cname}): {segs}")
    print(f"  {v.msg}")
    print(sim.state())
    if ntrace:
        print(f"  last {min(ntrace, len(sim.trace))} steps:")
        for who, ctx, site, desc in list(sim.trace)[-ntrace:]:
            ln = f"L{lineno(site)}" if site != "tma.land" else "-"
            print(f"    {who:4s} {ctx:34s} {ln:5s} {desc}")


def explore(runs, seed, bugs, fixed_segs=None, only_run=None, ntrace=12, quiet=False, max_reports=3, intent=True):
    """Returns a dict: runs, ok, caught (run count), kinds (Counter), first (message), steps, tiles."""
    stats = {"runs": 0, "ok": 0, "caught": 0, "kinds": collections.Counter(), "first": None, "steps": 0,
             "tiles": 0, "cases": collections.Counter(), "msgs": collections.Counter(),
             "blocked": collections.Counter()}
    reported = 0
    rr = range(runs) if only_run is None else [only_run]
    for run in rr:
        rng, cname, segs = case_for(run, seed, fixed_segs)
        res, (v, sim, steps) = run_once(segs, bugs, rng, intent)
        stats["runs"] += 1
        stats["steps"] += steps
        stats["tiles"] += sum(t1 - t0 for t0, t1 in segs)
        stats["cases"][cname] += 1
        stats["blocked"].update(sim.blocked_waits)
        if res == "ok":
            stats["ok"] += 1
            continue
        stats["caught"] += 1
        stats["kinds"][v.kind] += 1
        key = v.msg if v.kind == "deadlock" else re.sub(r"\d+", "#", v.msg.split(" (L")[0])
        stats["msgs"][key] += 1
        if stats["first"] is None:
            stats["first"] = (run, v)
        if not quiet and reported < max_reports and stats["msgs"][key] == 1:
            report(run, seed, cname, segs, bugs, res, v, sim, steps, ntrace)
            reported += 1
    return stats


def self_test(seed, runs_per_bug):
    t_start = time.time()
    ok = True
    print(f"self-test: the unmodified protocol, then each injected bug, {runs_per_bug} runs each (seed {seed});")
    print("  'plain': the same runs with the intent checks off (no phase / instance labels: only the PTX-level")
    print("  barrier rules, the data tags and deadlocks)")
    for intent in (True, False):
        clean = explore(max(runs_per_bug, 500), seed, [], quiet=True, intent=intent)
        ok &= clean["caught"] == 0
        print(f"  {'(none: the kernel as written)':24s} {clean['caught']:4d}/{clean['runs']} runs flagged"
              f"{'' if intent else ' (plain)'}  -> {'clean' if clean['caught'] == 0 else 'VIOLATIONS'}")
    for name, (what, sites) in BUGS.items():
        st = explore(runs_per_bug, seed, [name], quiet=True)
        plain = explore(runs_per_bug, seed, [name], quiet=True, intent=False)
        lines = ",".join(f"L{lineno(s)}" for s in sites)
        caught = st["caught"] > 0 and plain["caught"] > 0
        ok &= caught
        kinds = ", ".join(f"{k} {n}" for k, n in st["kinds"].most_common())
        pk = ", ".join(f"{k} {n}" for k, n in plain["kinds"].most_common())
        print(f"  {name:24s} {st['caught']:4d}/{st['runs']} runs flagged [{kinds}]; plain {plain['caught']}/"
              f"{plain['runs']} [{pk}]  -> {'CAUGHT' if caught else 'MISSED'}")
        print(f"      bug: {what} ({lines})")
        if st["first"]:
            run, v = st["first"]
            print(f"      e.g. run {run}: {v.kind}: {v.msg}")
    print("  removals the model finds no violation for (information, not part of the verdict; the model")
    print("  ignores convergence for bar.sync.aligned and proxy fences):")
    for name, (what, sites) in ABLATIONS.items():
        st = explore(runs_per_bug, seed, [name], quiet=True)
        lines = ",".join(f"L{lineno(s)}" for s in sites)
        print(f"  {name:24s} {st['caught']:4d}/{st['runs']} runs flagged  ({what}, {lines})")
        if st["first"]:
            run, v = st["first"]
            print(f"      e.g. run {run}: {v.kind}: {v.msg}")
    print(f"self-test {'PASSED' if ok else 'FAILED'} in {time.time() - t_start:.1f} s")
    return ok


def main():
    waits = ("wg0.q_ready", "wg0.full", "wg0.pfree", "wg12.syncwarp0", "wg12.full", "wg12.pfree", "wg12.wgbar",
             "iss.empty", "wg12.syncwarp1", "wg12.p_full", "wg12.fin")
    return protocol_cli.main(__doc__, KERNEL, locate_sites, MISSING_SITES, BUGS, ABLATIONS, where, self_test,
                             explore, waits)


if __name__ == "__main__":
    run(main)
