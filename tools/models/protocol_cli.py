"""The command line the protocol models share (fp8raw_, fp8pair_, gather3wg_, sparse_prefill_protocol.py): the
options, the kernel-site check, --list-bugs, --self-test, the exploration run (bugs checked, fixed
segments parsed, the random runs, the report of what the waits exercised and what was found) and
the entry point; the simulation machinery behind it is protocol_sim.py's. Standard library only."""
import argparse
import sys
import time


def main(doc, kernel, locate_sites, missing_sites, bugs, ablations, where, self_test, explore, waits,
         options=(), configure=None):
    """A model's main(): `doc` its docstring, `kernel` the kernel file its sites are found in
    (`locate_sites` fills `missing_sites` with those not found: a warning, and --self-test fails), `bugs` / `ablations` the
    injectable changes (name -> (what, sites)), `self_test(seed, runs) -> bool`,
    `explore(...)` the random runs, `waits` the sites whose blocking the report counts.
    `options`: the model's own options, (flags, add_argument keywords) each; `configure(args)`,
    called first with the parsed arguments, may change `bugs`, `ablations` and `waits` in place
    (a model with several forms: their bugs and waits)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=2000, help="random interleavings (default 2000)")
    ap.add_argument("--seed", default="1", help="base seed (run i uses seed:i)")
    ap.add_argument("--run", type=int, default=None, help="replay only run RUN of the seed")
    ap.add_argument("--segments", default=None, help="fixed tile counts of the segments, e.g. 3,1,2 (t0 = 0)")
    ap.add_argument("--bug", default="", help="inject bugs (comma-separated; see --list-bugs)")
    ap.add_argument("--trace", type=int, default=12, help="steps of history printed with a finding")
    ap.add_argument("--self-test", action="store_true", help="inject each bug and check the model catches it")
    ap.add_argument("--self-test-runs", type=int, default=300, help="runs per injected bug (default 300)")
    ap.add_argument("--list-bugs", action="store_true")
    ap.add_argument("--no-intent-checks", action="store_true",
                    help="drop the checks that use the code's intended phase / barrier instance of each "
                         "wait and arrival (keep the PTX-level rules, the data tags and deadlocks)")
    for flags, kw in options:
        ap.add_argument(*flags, **kw)
    args = ap.parse_args()
    if configure is not None:
        configure(args)
    locate_sites()
    if missing_sites:
        print(f"warning: {len(missing_sites)} kernel site(s) not found in {kernel}: {', '.join(missing_sites)} "
              "(the kernel changed? the model may be out of date)")
    if args.list_bugs:
        for name, (what, sites) in list(bugs.items()) + list(ablations.items()):
            print(f"{name:26s} {what}\n{'':26s} at {'; '.join(where(s) for s in sites)}")
        return 0
    if args.self_test:
        if missing_sites:  # a stale model fails CI: its report would point at the wrong code
            print(f"self-test FAILED: {len(missing_sites)} kernel site(s) not found (update the model's SITES "
                  "to the kernel, and the model to any change in its protocol):")
            for s in missing_sites:
                print(f"  {s:20s} sought: {where(s)}")
            return 1
        return 0 if self_test(args.seed, args.self_test_runs) else 1
    return explore_and_report(ap, args, set(bugs) | set(ablations), explore, where, waits)


def explore_and_report(ap, args, known_bugs, explore, where, wait_sites):
    """Runs `explore` as the arguments say and prints its report; the exit status: 0 when no run
    was flagged."""
    bugs = [b for b in args.bug.split(",") if b]
    for b in bugs:
        if b not in known_bugs:
            ap.error(f"unknown bug {b} (see --list-bugs)")
    fixed = None
    if args.segments is not None:
        fixed = [(0, int(x)) for x in args.segments.split(",") if x.strip()]
        if any(t1 < 1 for _, t1 in fixed):
            ap.error("segments have at least one tile")
    t_start = time.time()
    st = explore(args.runs, args.seed, bugs, fixed, args.run, args.trace, intent=not args.no_intent_checks)
    dt = time.time() - t_start
    print(f"\n{st['runs']} runs (seed {args.seed}{', bugs ' + ','.join(bugs) if bugs else ''}) in {dt:.1f} s: "
          f"{st['steps']} steps, {st['tiles']} tiles")
    print("  cases: " + ", ".join(f"{n} {c}" for c, n in st["cases"].most_common()))
    print("  waits that had to wait (did not return at once), over all runs:")
    for site in wait_sites:
        print(f"    {st['blocked'][site]:7d}  {where(site)}")
    if st["caught"] == 0:
        print(f"  no deadlock, no violation in {st['runs']} runs")
        return 0
    print(f"  {st['caught']} run(s) flagged: " + ", ".join(f"{k} {n}" for k, n in st["kinds"].most_common()))
    for m, n in st["msgs"].most_common(8):
        print(f"    {n:5d} x {m}")
    return 1


def run(main):
    """The models' entry point: main()'s status as the exit status (a closed pipe, as into head,
    ends quietly with 1)."""
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.stderr.close()
        sys.exit(1)
