"""The command line both protocol models share (fp8raw_protocol.py, gather3wg_protocol.py): the
exploration run of their main() (bugs checked, fixed segments parsed, the random runs, the report
of what the waits exercised and what was found) and the entry point. Standard library only."""
import sys
import time


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
