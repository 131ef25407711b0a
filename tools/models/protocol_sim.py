"""The kernel-independent machinery of the protocol models (fp8raw_, fp8pair_, gather3wg_,
sparse_prefill_protocol.py): what each model's docstring describes as "mbarriers as in PTX", "named
barriers", the shared-memory parts with their race bookkeeping, the random scheduler, the reports, the
kernel-site lookup, the run statistics and the self-test. Each model keeps its actors (the kernel's code
as generators of steps), its buffers and readers, its injected bugs and what it models and does not.
Standard library only (Python 3.11).

A model binds its kernel sites and its tag format once (bind()); the messages of a violation name the
kernel line through them (one model per process, as the scripts run).
"""
import collections
import os
import random
import re
import time

_BOUND = {"sites": None, "tagstr": str}


def bind(sites, tagstr):
    """The model's Sites (for where() and line()) and its tag format (for tagstr())."""
    _BOUND["sites"], _BOUND["tagstr"] = sites, tagstr


def where(site):
    return _BOUND["sites"].where(site)


def line(site):
    return _BOUND["sites"].line(site)


def tagstr(tag):
    return _BOUND["tagstr"](tag)


class Violation(Exception):
    def __init__(self, kind, msg):
        super().__init__(msg)
        self.kind, self.msg = kind, msg


# ---------------------------------------------------------------------------------------------
# Kernel sites.
class Sites:
    """The kernel line of each modelled step. `files`: file key -> path from the repository root, the
    first key the main file (its lines print as L12, the others' as header.cuh:12). `specs`: site ->
    (file key, chain of code snippets, n) or None (a step of no kernel line: the copy engine, the
    network; `none_text` describes it): each snippet is searched from the line of the one before, the
    last one's n-th occurrence from there is the step's line."""

    def __init__(self, files, specs, none_text):
        self.files, self.specs, self.none_text = files, specs, none_text
        self.main = next(iter(files))
        self.lines = {}  # site -> (file key, line number or None, code)
        self.missing = []  # sites whose snippets are no longer found

    def locate(self):
        here = os.path.dirname(os.path.abspath(__file__))
        texts = {}
        for fk, rel in self.files.items():
            try:
                with open(os.path.normpath(os.path.join(here, "..", "..", rel)), encoding="utf-8") as f:
                    texts[fk] = f.read().split("\n")
            except OSError:
                texts[fk] = []
        for key, spec in self.specs.items():
            if spec is None:
                self.lines[key] = (None, None, self.none_text)
                continue
            fk, chain, nth = spec
            i = find_chain(texts[fk], chain, nth)
            if i is None:
                self.missing.append(key)
                self.lines[key] = (fk, None, chain[-1])
            else:
                self.lines[key] = (fk, i + 1, texts[fk][i].strip())

    def line(self, site):
        """L12 (main file), header.cuh:12, L? / header.cuh:? (not found), - (no kernel line)."""
        fk, ln, _ = self.lines.get(site, (None, None, ""))
        if fk is None:
            return "-"
        pre = "L" if fk == self.main else f"{os.path.basename(self.files[fk])}:"
        return f"{pre}{ln if ln is not None else '?'}"

    def where(self, site):
        fk, _, code = self.lines.get(site, (None, None, site))
        return code if fk is None else f"{self.line(site)}: {code}"


def find_chain(text, chain, nth=0):
    """The index of the line of the chain's last snippet (its nth occurrence), or None."""
    i = 0
    for k, snip in enumerate(chain):
        skip = nth if k == len(chain) - 1 else 0
        while True:
            i = next((j for j in range(i, len(text)) if snip in text[j]), None)
            if i is None:
                return None
            if not skip:
                break
            skip, i = skip - 1, i + 1
    return i


# ---------------------------------------------------------------------------------------------
# Barriers.
class MBar:
    """An mbarrier as in PTX: phase = completed phases (current parity: phase & 1); a pending-arrival
    count and a transaction count per phase; the phase completes when both reach 0 (the pending count
    is then reset); arrivals beyond a completed phase's count go to the next phase. `meant`: the phase
    the code means an operation for (the intent checks, when `intent`). `init`: False for a barrier that
    its CTA must initialize first (every operation before that is a violation). `tracked`: arrivals
    raised by cp.async.mbarrier.arrive (without .noinc) whose copies are in flight."""

    def __init__(self, name, count, intent=True, init=True, cta=None):
        self.name, self.count, self.intent, self.init, self.cta = name, count, intent, init, cta
        self.pending, self.tx, self.phase, self.tracked = count, 0, 0, 0

    def check_init(self, who, site):
        if not self.init:
            raise Violation("mbarrier", f"{who} reaches {self.name} before it is initialized ({where(site)})")

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def arrive(self, n, meant, who, site, what="arrival"):
        """n arrivals (an actor's threads); returns the phase the last of them counted in."""
        if not self.init:
            self.check_init(who, site)
        last = self.phase
        while n > 0:
            if self.pending == 0:
                raise Violation("mbarrier", f"{who} arrives on {self.name} beyond its count {self.count} while "
                                f"phase {self.phase} still waits for {self.tx} bytes ({where(site)})")
            if self.intent and meant is not None and meant != self.phase:
                raise Violation("mbarrier", f"{who}'s {what} on {self.name} meant for phase {meant} counts in "
                                f"phase {self.phase} ({where(site)})")
            last = self.phase
            take = min(n, self.pending)
            self.pending -= take
            n -= take
            self._complete()
        return last

    def expect_tx(self, nbytes, meant, who, site):
        """arrive.expect_tx: tx += bytes, then one arrival."""
        self.check_init(who, site)
        self.tx += nbytes
        self.arrive(1, meant, who, site)

    def complete_tx(self, nbytes, meant, what, site=None):
        """Bytes of a copy (TMA, st.async) landing."""
        if not self.init:
            self.check_init(what, site)
        if self.intent and meant is not None and meant != self.phase:
            raise Violation("mbarrier", f"{what}: its bytes on {self.name} meant for phase {meant} land in phase "
                            f"{self.phase}")
        self.tx -= nbytes
        self._complete()

    def track(self, n, meant, who, site):
        """cp.async.mbarrier.arrive without .noinc: the pending count is raised now, lowered when the
        copies land (arrive)."""
        if self.intent and meant is not None and meant != self.phase:
            raise Violation("mbarrier", f"{who}'s track on {self.name} meant for phase {meant} counts in phase "
                            f"{self.phase} ({where(site)})")
        self.pending += n
        self.tracked += n

    def half_done(self):
        return self.pending != self.count or self.tx != 0 or self.tracked != 0

    def __str__(self):
        s = f"{self.name}: {self.phase} phases done (parity {self.phase & 1}), "
        if self.tracked:
            return s + f"pending {self.pending} of {self.count} ({self.tracked} for copies in flight)"
        return s + f"{self.count - self.pending}/{self.count} arrived" + (f", tx {self.tx}" if self.tx else "")


class NamedBar:
    """A named barrier (bar.arrive / bar.sync with a thread count; an actor adds its weight in threads):
    an instance completes at its count, bar.sync waits for the instance it arrived on (gen). `label`:
    the instance the code means (tile, segment): arrivals for two instances pending on one id are a
    violation (an intent check)."""

    def __init__(self, name, intent=True, bid=None):
        self.name, self.intent, self.bid = name, intent, bid
        self.label = name if bid is None else f"{bid} ({name})"
        self.count, self.arrived, self.labels, self.gen = None, 0, collections.Counter(), 0

    def arrive(self, n, w, label, who, site):
        """Adds w arrivals; returns the generation (instance number) arrived on."""
        if self.count is None:
            self.count = n
        elif self.count != n:
            raise Violation("named", f"{who} arrives on {self.label} with count {n} while the pending instance has "
                            f"count {self.count} ({where(site)})")
        if self.intent and label is not None and self.labels and label not in self.labels:
            raise Violation("named", f"{who} arrives on {self.label} for {label} while arrivals for "
                            f"{dict(self.labels)} are pending: two instances on one id ({where(site)})")
        self.arrived += w
        self.labels[label] += w
        gen = self.gen
        if self.arrived > self.count:
            raise Violation("named", f"{who} brings {self.label} to {self.arrived} arrivals, beyond its count "
                            f"{self.count} ({dict(self.labels)}) ({where(site)})")
        if self.arrived == self.count:
            self.gen += 1
            self.count, self.arrived, self.labels = None, 0, collections.Counter()
        return gen

    def __str__(self):
        name = self.name if self.bid is None else f"{self.bid} {self.name}"
        if self.count is None:
            return f"{name}: idle ({self.gen} instances completed)"
        return f"{name}: {self.arrived}/{self.count} arrived for {dict(self.labels)} ({self.gen} instances completed)"


# ---------------------------------------------------------------------------------------------
# Shared memory: a part of a buffer, written and read as intervals (begin / end steps).
class Part:
    """`tag` the contents' tag (what was written: tile, segment), `writing` the tag of a write in
    progress (by `writer`), `pending` reader -> reads owed to the contents before they may be
    overwritten, `open` reader -> open read intervals, `lag` (gather3wg's fp8 form) who -> accesses a
    warp may still be in."""
    __slots__ = ("tag", "writing", "writer", "pending", "open", "lag")

    def __init__(self):
        self.tag = self.writing = self.writer = None
        self.pending = collections.Counter()
        self.open = collections.Counter()
        self.lag = collections.Counter()


def begin_write(p, loc, who, tag, readers, site, note=""):
    """A write of `tag` into part p (named loc) starts; `readers`: who must read it how often. Races:
    another write in flight, a read open, reads owed to the previous contents."""
    if p.writing is not None:
        raise Violation("race", f"{who} starts writing {loc} ({tagstr(tag)}) while {p.writer} still writes "
                        f"{tagstr(p.writing)} into it{note} ({where(site)})")
    if any(p.open.values()):
        raise Violation("race", f"{who} starts writing {loc} ({tagstr(tag)}) while "
                        f"{', '.join(x for x, n in p.open.items() if n)} still read(s) its {tagstr(p.tag)}{note} "
                        f"({where(site)})")
    if any(p.pending.values()):
        raise Violation("race", f"{who} overwrites {loc} holding {tagstr(p.tag)} with {tagstr(tag)} before "
                        + ", ".join(f"{x} read it ({n} read(s) owed)" for x, n in p.pending.items() if n)
                        + f" ({where(site)})")
    p.writing, p.writer, p.pending = tag, who, collections.Counter(readers)


def end_write(p):
    p.tag, p.writing, p.writer = p.writing, None, None


def begin_read(p, loc, who, tag, site, note=""):
    """`who` starts reading part p, expecting `tag`. Races: a write in flight, other contents, a read
    the model does not expect."""
    if p.writing is not None:
        raise Violation("race", f"{who} reads {loc} expecting {tagstr(tag)} while {p.writer} still writes "
                        f"{tagstr(p.writing)} into it{note} ({where(site)})")
    if p.tag != tag:
        raise Violation("race", f"{who} reads {loc} expecting {tagstr(tag)} but it holds {tagstr(p.tag)} "
                        f"({where(site)})")
    if p.pending[who] <= 0:
        raise Violation("race", f"{who} reads {loc} ({tagstr(tag)}) more often than the model expects ({where(site)})")
    p.open[who] += 1


def end_read(p, who):
    p.open[who] -= 1
    p.pending[who] -= 1


def end_checks(mbars, nbars, parts):
    """At the end of a run: every named-barrier instance complete, every mbarrier phase whole, every
    write read as often as its readers owe. `parts`: (loc, Part) pairs."""
    for nb in nbars:
        if nb.count is not None:
            raise Violation("named", f"at the end: barrier {nb} (an instance left incomplete)")
    for mb in mbars:
        if mb.half_done():
            raise Violation("mbarrier", f"at the end: {mb} (a phase left half-done)")
    for loc, p in parts:
        owed = {x: n for x, n in p.pending.items() if n}
        if owed:
            raise Violation("race", f"at the end: {loc} holds {tagstr(p.tag)} that {owed} never read")


# ---------------------------------------------------------------------------------------------
# The scheduler.
class SimBase:
    """What a model's Sim shares: enabled(actor), whether the actor's step can be taken now (an
    mbarrier wait once the current phase's parity differs from the one it waits on, try_wait.parity; a
    bar.sync once the instance it arrived on completed; any other step at once). A model extends it
    for its own blocking steps."""

    def enabled(self, a):
        op = a.op
        if op.kind == "mwait":
            return (op.bar.phase & 1) != op.parity
        if op.kind == "bsync":
            return not op.arrived or op.bar.gen > op.gen
        return True


PACES = (0.03, 0.3, 1.0, 1.0, 4.0)  # an actor's relative pace, drawn per run
NEW_PACES = (0.03, 0.3, 1.0, 4.0)  # now and then one actor (or the engine) changes to one of these


def run_once(sim, rng, max_steps, draw_always=False):
    """One random interleaving of sim's actors and its engine (the copy engine, the network: what lands
    in any order at a later step). Returns (result, (violation or None, sim, steps)), result 'ok',
    'violation' or 'deadlock'. sim provides: actors (each with name, op: the step it is at, None when
    done), enabled(actor), step(actor), engine() (the events in flight, a sequence), engine_step(events,
    i), final_checks(). draw_always: draw from the random stream even with one candidate (the stream of
    gather3wg_protocol.py's runs)."""
    actors = sim.actors
    speeds = [rng.choice(PACES) for _ in range(len(actors) + 1)]  # last: the engine
    steps = 0
    try:
        while True:
            steps += 1
            if steps > max_steps:
                return "violation", (Violation("livelock", f"no end after {max_steps} steps"), sim, steps)
            if rng.random() < 0.02:
                speeds[rng.randrange(len(speeds))] = rng.choice(NEW_PACES)
            cand, wts = [], []
            for i, a in enumerate(actors):
                if a.op is not None:
                    if sim.enabled(a):
                        cand.append(a)
                        wts.append(speeds[i])
                    else:
                        a.op.blocked = True
            ev = sim.engine()
            if ev:
                cand.append(None)
                wts.append(speeds[-1])
            if not cand:
                if all(a.op is None for a in actors):
                    sim.final_checks()
                    return "ok", (None, sim, steps)
                stuck = ", ".join(f"{a.name} at {line(a.op.site)}" for a in actors if a.op is not None)
                return "deadlock", (Violation("deadlock", f"no actor can step: {stuck}"), sim, steps)
            a = rng.choices(cand, wts)[0] if len(cand) > 1 or draw_always else cand[0]
            if a is None:
                sim.engine_step(ev, rng.randrange(len(ev)))
            else:
                sim.step(a)
    except Violation as v:
        return "violation", (v, sim, steps)


def record_step(op, trace, blocked_waits, who, ctx):
    """Records a step in the trace (a wait that returns: '-> passes', counted in blocked_waits when it
    had to wait)."""
    desc = op.describe()
    if op.kind == "mwait" or (op.kind == "bsync" and op.arrived) or op.kind == "cpwait":
        if op.kind != "cpwait":
            desc = desc.replace(" [arrived, waiting]", "").replace(" [arrived]", "") + " -> passes"
        if op.blocked:
            blocked_waits[op.site] += 1
    trace.append((who, ctx, op.site, desc))


def check_wait(op, who, intent):
    """An mbarrier wait that returns: a violation (an intent check) if the phase it means has not
    completed (its parity matched an older phase)."""
    if intent and op.meant is not None and op.bar.phase <= op.meant:
        raise Violation("mbarrier", f"{who}: mbar_wait({op.bar.name}, parity {op.parity}) returns before phase "
                        f"{op.meant} has completed ({op.bar.phase} phases done) ({where(op.site)})")


def actor_lines(sim, width=0, extra=None):
    """The state of each actor: done, or blocked / ready at its step (an mbarrier wait with the
    barrier's phase). extra(actor): more lines for it."""
    out = ["  actors:"]
    for a in sim.actors:
        if a.op is None:
            out.append(f"    {a.name:{width}s} done ({a.ctx})")
            continue
        enabled = sim.enabled(a)
        more = ""
        if a.op.kind == "mwait":
            b = a.op.bar
            more = f"  [{b.name} at {b.phase} phases done, parity {b.phase & 1}]"
            if a.op.meant is not None and b.phase > a.op.meant and not enabled:
                more += (f" <- phase {a.op.meant} has completed, but parity {a.op.parity} is the current phase's "
                         f"({b.phase}): the wait cannot return")
        out.append(f"    {a.name:{width}s} {'ready  ' if enabled else 'blocked'} {a.ctx}: {a.op.describe()} at "
                   f"{where(a.op.site)}{more}")
        if extra is not None:
            out += extra(a)
    return out


def barrier_lines(mbars, nbars):
    """The state of the mbarriers and of the named barriers with arrivals pending."""
    return ["  mbarriers: " + "; ".join(str(m) for m in mbars),
            "  named barriers: " + ("; ".join(str(n) for n in nbars if n.count is not None) or "no arrivals pending")]


# ---------------------------------------------------------------------------------------------
# Cases, runs, statistics, reports.
def segment_case(run, seed, fixed_segs, fixed_cases, random_segments):
    """The run's generator (seed:run), case name and segments: the given ones, else the fixed cases for
    the first runs, then random_segments(rng) -> (name, segments)."""
    rng = random.Random(f"{seed}:{run}")
    if fixed_segs is not None:
        return rng, "given segments", fixed_segs
    if run < len(fixed_cases):
        name, segs = fixed_cases[run]
        return rng, name, segs
    name, segs = random_segments(rng)
    return rng, name, segs


def fixed_cases(ones, twos, long_end):
    """The first runs' segment lists (ones / twos: how many one- / two-tile segments, long_end: t1 of
    the long one)."""
    return [("zero segments", []), ("one segment of one tile", [(0, 1)]), ("many one-tile segments", [(0, 1)] * ones),
            ("many two-tile segments", [(0, 2)] * twos), ("three short segments", [(0, 3), (0, 1), (0, 2)]),
            ("one tile mid-sequence", [(5, 6)]), ("one long segment", [(2, long_end)]),
            ("odd lengths", [(1, 4), (0, 1), (0, 5), (0, 2), (0, 1)])]


def random_segments(rng, short_max, long_max):
    """fp8raw's and fp8pair's random segment lists (short_max: most short segments, long_max: most
    tiles past 2 of one long one)."""
    r = rng.random()
    if r < 0.04:
        return "zero segments", []
    if r < 0.08:
        return "one segment of one tile", [(0, 1)]
    if r < 0.30:
        n = rng.randint(4, short_max)
        return "many short segments", [(0, rng.choice((1, 1, 1, 2, 3))) for _ in range(n)]
    if r < 0.40:
        t0 = rng.randint(0, 4)
        return "one long segment", [(t0, t0 + rng.randint(2, long_max))]
    n = rng.randint(1, 5)
    segs = []
    for i in range(n):
        t0 = rng.randint(0, 3) if i == 0 else 0
        segs.append((t0, t0 + rng.randint(1, 6)))
    return "random segments", segs


def explore(runs, seed, bugs, case, run_one, report, only_run=None, quiet=False, max_reports=3, stop_after=None):
    """The random runs: case(run) -> (rng, case name, the case, tiles, the key it is counted under),
    run_one(the case, rng) -> run_once's result, report(run, case name, the case, result, violation,
    sim) prints a finding (the first max_reports of distinct messages, unless quiet). stop_after: stop
    once that many runs were flagged. Returns a dict: runs, ok, caught (run count), kinds (Counter),
    first ((run, violation)), steps, tiles, cases, msgs, blocked (site -> waits that had to wait),
    events (sim.events summed, where the model counts any)."""
    stats = {"runs": 0, "ok": 0, "caught": 0, "kinds": collections.Counter(), "first": None, "steps": 0,
             "tiles": 0, "cases": collections.Counter(), "msgs": collections.Counter(),
             "blocked": collections.Counter(), "events": collections.Counter()}
    reported = 0
    for run in (range(runs) if only_run is None else [only_run]):
        rng, cname, c, tiles, key = case(run)
        res, (v, sim, steps) = run_one(c, rng)
        stats["runs"] += 1
        stats["steps"] += steps
        stats["tiles"] += tiles
        stats["cases"][key] += 1
        stats["blocked"].update(sim.blocked_waits)
        stats["events"].update(getattr(sim, "events", ()))
        if res == "ok":
            stats["ok"] += 1
            continue
        stats["caught"] += 1
        stats["kinds"][v.kind] += 1
        mkey = v.msg if v.kind == "deadlock" else re.sub(r"\d+", "#", v.msg.split(" (L")[0])
        stats["msgs"][mkey] += 1
        if stats["first"] is None:
            stats["first"] = (run, v)
        if not quiet and reported < max_reports and stats["msgs"][mkey] == 1:
            report(run, cname, c, res, v, sim)
            reported += 1
        if stop_after is not None and stats["caught"] >= stop_after:
            break
    return stats


def explore_segments(runs, seed, bugs, fixed_segs, only_run, ntrace, quiet, max_reports, stop_after, cases, randoms,
                     run_one, replay, widths):
    """explore() over lists of segments (t0, t1): the given ones, else the fixed `cases` for the first
    runs, then randoms(rng) -> (name, segments); run_one(segments, rng) -> run_once's result; replay,
    widths: print_report's."""
    def case(run):
        rng, cname, segs = segment_case(run, seed, fixed_segs, cases, randoms)
        return rng, cname, segs, sum(t1 - t0 for t0, t1 in segs), cname

    def report(run, cname, segs, res, v, sim):
        print_report(run, seed, bugs, replay, res, v, [f"segments ({cname}): {segs}"], sim, ntrace, widths)

    return explore(runs, seed, bugs, case, run_one, report, only_run, quiet, max_reports, stop_after)


def print_report(run, seed, bugs, replay, res, v, case_lines, sim, ntrace, widths):
    """A finding: the replay command line, the case, the message, the state and the last ntrace steps
    (widths: of the actor, context and line columns)."""
    print(f"\n=== run {run} (seed {seed}, replay: {replay}--seed {seed} --run {run}"
          + (f" --bug {','.join(bugs)}" if bugs else "") + f"): {res.upper()}, kind {v.kind}")
    for ln in case_lines:
        print(f"  {ln}")
    print(f"  {v.msg}")
    print(sim.state())
    if ntrace:
        ww, cw, lw = widths
        print(f"  last {min(ntrace, len(sim.trace))} steps:")
        for who, ctx, site, desc in list(sim.trace)[-ntrace:]:
            print(f"    {who:{ww}s} {ctx:{cw}s} {line(site):{lw}s} {desc}")


def self_test(explore_fn, bugs, ablations, seed, runs, width, min_clean, title="", ablation_note="",
              stop_after=None, plain_checks="the data tags and deadlocks"):
    """Runs the unmodified protocol (at least min_clean runs, with and without the intent checks: no
    run may be flagged), then each injected bug (`runs` runs each, both ways: at least one flagged
    each way), then the ablations (information only). explore_fn(runs, seed, bugs, intent=..., quiet=
    True, stop_after=...); plain_checks: what the runs without the intent checks still check. Returns
    True when every bug was caught and the protocol is clean."""
    t_start = time.time()
    ok = True
    kinds = lambda s: ", ".join(f"{k} {n}" for k, n in s["kinds"].most_common())  # noqa: E731
    print(f"self-test{title}: the unmodified protocol, then each injected bug, "
          + (f"up to {runs} runs each (seed {seed}; a bug's runs stop at its {stop_after}th flagged run);"
             if stop_after else f"{runs} runs each (seed {seed});"))
    print("  'plain': the same runs with the intent checks off (no phase / instance labels: only the PTX-level")
    print(f"  barrier rules, {plain_checks})")
    for intent in (True, False):
        clean = explore_fn(max(runs, min_clean), seed, [], quiet=True, intent=intent)
        ok &= clean["caught"] == 0
        print(f"  {'(none: the kernel as written)':{width}s} {clean['caught']:4d}/{clean['runs']} runs flagged"
              f"{'' if intent else ' (plain)'}  -> {'clean' if clean['caught'] == 0 else 'VIOLATIONS'}")
        if clean["first"]:
            run, v = clean["first"]
            print(f"      e.g. run {run}: {v.kind}: {v.msg}")
    for name, (what, sites) in bugs.items():
        st = explore_fn(runs, seed, [name], quiet=True, stop_after=stop_after)
        plain = explore_fn(runs, seed, [name], quiet=True, intent=False, stop_after=stop_after)
        caught = st["caught"] > 0 and plain["caught"] > 0
        ok &= caught
        print(f"  {name:{width}s} {st['caught']:4d}/{st['runs']} runs flagged [{kinds(st)}]; plain {plain['caught']}/"
              f"{plain['runs']} [{kinds(plain)}]  -> {'CAUGHT' if caught else 'MISSED'}")
        print(f"      bug: {what} ({','.join(line(s) for s in sites)})")
        if st["first"]:
            run, v = st["first"]
            print(f"      e.g. run {run}: {v.kind}: {v.msg}")
    print(f"  removals the model finds no violation for (information, not part of the verdict{ablation_note}):")
    for name, (what, sites) in ablations.items():
        st = explore_fn(runs, seed, [name], quiet=True)
        print(f"  {name:{width}s} {st['caught']:4d}/{st['runs']} runs flagged  ({what}; "
              f"{','.join(line(s) for s in sites)})")
        if st["first"]:
            run, v = st["first"]
            print(f"      e.g. run {run}: {v.kind}: {v.msg}")
    print(f"self-test {'PASSED' if ok else 'FAILED'} in {time.time() - t_start:.1f} s")
    return ok

