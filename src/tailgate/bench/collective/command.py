"""``tailgate bench allreduce``: options, launch checks, and the run on every rank.

Launched the way each backend is launched in production::

    mpirun -np 4 tailgate bench allreduce --backend mpi --sizes 8B..1MiB
    torchrun --nproc-per-node 2 -m tailgate bench allreduce --backend gloo --sizes 1KiB..1MiB

Every rank parses the same command line and runs the same plan; rank 0 alone
gathers and hands the document to the caller's ``save`` (the command's: it writes the
files and prints, :mod:`tailgate.report.collective_render`), then tells every rank the
exit status, so the launcher's own status is the gate. ``--nccl-tests FILE`` reads an nccl-tests
``*_perf`` output instead (no launcher) into the same document.

Exit status: 0 fine; 1 a wrong result or a failed SLO; 2 bad usage or a
backend that cannot run here (NCCL without a GPU, a library not installed);
124 the run passed ``--timeout`` (every rank is ended).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any, Protocol

from ...errors import UsageError
from ...outputs import check_writable
from .backends import BACKENDS
from .spec import DTYPES, OPS

DEFAULT_SIZES = "8B..1MiB"


class Save(Protocol):
    """Rank 0's outputs of a document: its files where asked, and its terminal report."""

    def __call__(self, doc: dict[str, Any], json_path: str | None = None,
                 html_path: str | None = None, hdr_path: str | None = None,
                 hists: list[tuple[float, float, Any]] | None = None,
                 start_epoch_s: float = 0.0) -> None: ...


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tailgate bench allreduce",
        description="Time every AllReduce iteration as the slowest rank saw it (P50..P999, "
        "max), with nccl-tests' algbw/busbw, the straggler rank, and a check of every result. "
        "Launch it with the backend's launcher; or read an nccl-tests output with --nccl-tests.",
        epilog="examples:\n"
        "  mpirun -np 4 tailgate bench allreduce --backend mpi --sizes 8B..1MiB "
        "--slo 'p999<200ms'\n"
        "  torchrun --nproc-per-node 2 -m tailgate bench allreduce --backend gloo "
        "--sizes 1KiB..1MiB --json out.json\n"
        "  tailgate bench allreduce --nccl-tests all_reduce_perf.log --slo 'busbw>=100'\n"
        "(as root, mpirun needs --allow-run-as-root; more ranks than cores: --oversubscribe)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=BACKENDS, default="mpi",
                   help="mpi (mpi4py, under mpirun), gloo (torch.distributed on CPU, under "
                   "torchrun) or nccl (torch.distributed on GPUs, under torchrun); default mpi")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="message sizes: a doubling range 8B..1GiB (KiB/MiB/GiB are 1024-based, "
                   "K/M/G 1000-based, as everywhere in tailgate), a range with a factor "
                   "1KiB..1MiB:4, or a list 1KiB,1MiB "
                   f"(default {DEFAULT_SIZES})")
    p.add_argument("--iters", type=int, default=1000,
                   help="measured iterations per size (default 1000: a P999 needs thousands)")
    p.add_argument("--warmup", type=int, default=20,
                   help="unmeasured iterations first, per size (default 20)")
    p.add_argument("--op", choices=OPS, default="sum", help="reduction (default sum)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32",
                   help="element type (default float32; bfloat16 with gloo/nccl)")
    p.add_argument("--in-place", action="store_true",
                   help="reduce in place (MPI_IN_PLACE); torch.distributed always does")
    p.add_argument("--gap", default="0s", metavar="DURATION",
                   help="pause before each iteration, as a step's compute would (default 0s)")
    p.add_argument("--no-check", action="store_true",
                   help="do not check the result buffers (wrong is then n/a)")
    p.add_argument("--timeout", default="600s", metavar="DURATION",
                   help="end every rank if the whole run takes longer (default 600s)")
    p.add_argument("--nccl-tests", metavar="FILE",
                   help="read this nccl-tests *_perf output ('-': stdin) instead of measuring")
    p.add_argument("--ranks", type=int,
                   help="with --nccl-tests: number of ranks, when the output lists no devices")
    g = p.add_argument_group("results")
    g.add_argument("--slo", action="append", default=[], metavar="EXPR",
                   help="objective every size must meet: 'p999<200ms', 'p99<5ms', 'max<1s', "
                   "'busbw>=10' (GB/s), 'algbw>=5', 'wrong<=0' (repeatable; exit 1 if one fails)")
    g.add_argument("--json", metavar="FILE", help="write the result JSON to FILE ('-': stdout)")
    g.add_argument("--html", metavar="FILE", help="write a self-contained HTML page")
    g.add_argument("--hdr", metavar="FILE",
                   help="write the per-iteration histograms as an HdrHistogram log, one tag "
                   "per size")
    g.add_argument("--min-tail-samples", type=int, default=10,
                   help="warn when fewer samples than this lie above the P999")
    g.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def launcher_rank() -> int:
    """This process's rank as its launcher announced it (0 when started alone)."""
    for key in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def _parse(args: argparse.Namespace) -> tuple[Any, list[Any], float]:
    from ..units import parse_duration
    from .result import parse_slo
    from .run import Plan
    from .spec import element_count, parse_sizes

    try:
        sizes = parse_sizes(args.sizes)
        dtype = DTYPES[args.dtype]
        for n in sizes:
            element_count(n, dtype)
        gap = parse_duration(args.gap)
        timeout = parse_duration(args.timeout)
        slos = [parse_slo(e) for e in args.slo]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.iters < 1 or args.warmup < 0:
        raise UsageError("--iters must be >= 1 and --warmup >= 0")
    if args.iters > 10_000_000:
        raise UsageError("--iters over 10 million: the timestamps alone would not fit")
    if gap < 0 or gap > 10 or timeout <= 0:
        raise UsageError("--gap must be within 0..10 s and --timeout > 0")
    if args.backend == "mpi" and dtype.numpy is None:
        raise UsageError(f"--backend mpi has no {dtype.name} (Open MPI 4.1 has no such "
                         "datatype): use float32, float64 or int32, or --backend gloo|nccl")
    placement = "in_place" if (args.in_place or args.backend != "mpi") else "out_of_place"
    plan = Plan(sizes=tuple(sizes), dtype=dtype, op=args.op, placement=placement,
                iters=args.iters, warmup=args.warmup, gap_s=gap, check=not args.no_check)
    return plan, slos, timeout


def run(args: argparse.Namespace, save: Save) -> int:
    """Measure (or read nccl-tests output), judge, and on rank 0 ``save`` the document:
    ``save(doc, json_path, html_path, hdr_path, hists, start_epoch_s)``."""
    try:
        return _run(args, save)
    except UsageError:
        if launcher_rank() != 0:
            return 2  # rank 0 says it once, not every rank
        raise


def _run(args: argparse.Namespace, save: Save) -> int:
    if args.nccl_tests:
        return _from_nccl_tests(args, save)
    from .backends import BackendUnavailable, connect

    plan, slos, timeout = _parse(args)
    try:
        comm = connect(args.backend, timeout)
    except BackendUnavailable as exc:
        raise UsageError(str(exc)) from None
    problem = None
    if comm.rank == 0:
        try:
            check_writable(args.json, args.hdr, args.html)
        except UsageError as exc:
            problem = str(exc)
    problem = comm.bcast(problem)
    if problem:
        comm.close()
        raise UsageError(problem)

    def overdue() -> None:
        if comm.rank == 0:
            print(f"tailgate bench allreduce: error: the run passed --timeout {args.timeout}; "
                  "ending every rank", file=sys.stderr, flush=True)
        comm.abort(124)

    watchdog = threading.Timer(timeout, overdue)
    watchdog.daemon = True
    watchdog.start()
    say = None if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    try:
        from .run import measure

        measured = measure(comm, plan, say)
        code = 0
        if measured is not None:
            code = _report(args, save, comm, plan, slos, *measured)
        code = comm.bcast(code)
    finally:
        watchdog.cancel()
    comm.close()
    return code


def _report(args: argparse.Namespace, save: Save, comm: Any, plan: Any, slos: list[Any],
            runs: list[Any], clock: Any) -> int:
    from .analyze import analyze
    from .result import evaluate_slos, exit_status, warnings

    blocks, hists = [], []
    t_first = min(int(r.enter_ns.min()) for r in runs[0].ranks) if runs else 0
    for size_run in runs:
        block, hist = analyze(size_run, min_tail_samples=args.min_tail_samples)
        blocks.append(block)
        t0 = min(int(r.enter_ns.min()) for r in size_run.ranks)
        t1 = max(int(r.exit_ns.max()) for r in size_run.ranks)
        hists.append(((t0 - t_first) / 1e9, (t1 - t0) / 1e9, hist))
    doc: dict[str, Any] = {
        "tailgate_collective": 1, "source": "tailgate", "collective": plan.collective,
        "backend": comm.backend, "library": comm.library, "ranks": comm.size,
        "hosts": [r.host for r in sorted(runs[0].ranks, key=lambda r: r.rank)] if runs else [],
        "config": {"dtype": plan.dtype.name, "op": plan.op, "placement": plan.placement,
                   "iters": plan.iters, "warmup": plan.warmup, "gap_s": plan.gap_s,
                   "check": plan.check, "sizes": list(plan.sizes)},
        "clock": clock.json(),
        "sizes": blocks,
    }
    doc["warnings"] = warnings(blocks, args.min_tail_samples)
    if not clock.shared:
        doc["warnings"].append(f"ranks on several hosts: arrival order (the straggler) rests on "
                               f"clock offsets estimated to within {clock.error_us:.0f} us")
    doc["slo"] = evaluate_slos(slos, blocks)
    epoch0 = time.time() - (time.monotonic_ns() - t_first) / 1e9
    save(doc, args.json, args.html, args.hdr, hists, epoch0)
    return exit_status(doc)


def _from_nccl_tests(args: argparse.Namespace, save: Save) -> int:
    from .nccl_tests import NcclTestsError, parse
    from .result import evaluate_slos, exit_status, parse_slo

    try:
        slos = [parse_slo(e) for e in args.slo]
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.hdr:
        raise UsageError("--hdr needs measured iterations; nccl-tests output has only means")
    if args.ranks is not None and args.ranks < 1:
        raise UsageError("--ranks must be >= 1")
    check_writable(args.json, args.html)
    try:
        if args.nccl_tests == "-":
            text = sys.stdin.read()
        else:  # a regular file under a cap: a FIFO or /dev/zero never ends
            from ...host import TooLarge, read_regular
            from ...model import SourceError

            try:
                text = read_regular(os.path.realpath(args.nccl_tests), 64 * 2**20,
                                    what=args.nccl_tests).decode("utf-8", errors="replace")
            except (TooLarge, SourceError) as exc:
                raise UsageError(f"cannot read {exc}") from None
    except OSError as exc:
        raise UsageError(f"cannot read {args.nccl_tests}: {exc.strerror or exc}") from None
    try:
        doc = parse(text, ranks=args.ranks, default_collective="allreduce")
    except NcclTestsError as exc:
        raise UsageError(f"{args.nccl_tests}: {exc}") from None
    doc["file"] = args.nccl_tests
    doc["slo"] = evaluate_slos(slos, doc["sizes"])
    save(doc, args.json, args.html)
    return exit_status(doc)
