"""The `dealias` command line: `dealias demo` compiles built-in examples, prints their traces and checks
them against eager PyTorch; `dealias report DIR` rebuilds a recorded run's HTML report."""

from __future__ import annotations

import argparse
import sys

from . import demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dealias", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="compile the built-in examples, print their traces, check them against eager")
    fz = sub.add_parser("fuzz", help="run random programs eagerly and through dealias.jit, compare, shrink failures")
    fz.add_argument("--seed", type=int, default=0)
    fz.add_argument("--count", type=int, default=200)
    fz.add_argument("--time", type=float, default=None, help="stop after this many seconds")
    fz.add_argument(
        "--autograd",
        action="store_true",
        help="only programs on inputs that require grad (no_grad regions, autograd.Function, hooks, detach writes)",
    )
    fz.add_argument("--executor", default="torch", choices=["torch", "inductor", "exact", "tiered"])
    fz.add_argument(
        "--dynamic", action="store_true", help="every size symbolic from the first call (dealias.jit(dynamic=True))"
    )
    fz.add_argument(
        "--wide",
        action="store_true",
        help="wider statements too: other ops, dtypes, in-place results kept (other programs)",
    )
    dr = sub.add_parser("doctor", help="which of dealias's corrections to torch are in force on this torch, and why")
    dr.add_argument(
        "--probe", action="store_true", help="run each correction's example under dynamo alone and under dealias"
    )
    rp = sub.add_parser("report", help="rebuild the HTML report of a run recorded with DEALIAS_REPORT=DIR")
    rp.add_argument("dir", help="the directory the run recorded into")
    args = parser.parse_args(argv)
    if args.command == "report":
        from ..report import rebuild

        print(f"dealias report: {rebuild(args.dir)}")
        return 0
    if args.command == "doctor":
        return doctor(args.probe)
    if args.command == "demo":
        return demo.run()
    if args.command == "fuzz":
        from .fuzz import fuzz

        autograd = True if args.autograd else None
        s = fuzz(
            args.seed,
            args.count,
            args.time,
            autograd=autograd,
            executor=args.executor,
            dynamic=args.dynamic,
            wide=args.wide,
        )
        print(
            f"{s['programs']} programs in {s['seconds']} s: {s['ok']} matched eager, {s['error-matched']} raised "
            f"as eager did, {s['fallback']} ran a graph eagerly (fallback), {s['overlap']} ran a write whose elements "
            f"share memory eagerly (overlap), {s['eager-raises']} ran eagerly where eager raises later (at backward), "
            f"{s['graph-break']} had a part dynamo ran eagerly (graph break), {s['split']} compiled as more than one "
            "graph with no op run eagerly between them (split), "
            f"{s['refused']} refused, {s['mismatch']} MISMATCHED"
        )
        return 1 if s["mismatch"] else 0
    return 2


def doctor(probe: bool) -> int:
    """Print compat's report; with `probe`, each correction's example run by dynamo alone (backend="eager") and by
    dealias, against eager: whether upstream still needs the correction, and whether dealias is exact."""
    import warnings

    import dealias  # noqa: F401 - installs the corrections
    from dealias import compat
    from dealias.compat.examples import EXAMPLES
    from dealias.compat.examples import probe as run_example

    compat.install_all(lazy=True)  # (the fused executor's, installed at its first compile otherwise)
    print(compat.report())
    if not probe:
        return 0
    failed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in EXAMPLES:
            upstream = run_example(name, "eager")
            ours = run_example(name, "dealias")
            failed += ours is not None
            print(
                f"{name}: dynamo alone {'differs from eager' if upstream else 'matches eager'}; "
                f"dealias {'DIFFERS: ' + ours if ours else 'matches eager'}"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
