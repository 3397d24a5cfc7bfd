"""The `tailgate` command: parse arguments, hand off to a command module, exit.

Each command lives in ``tailgate/commands/<name>.py`` and exposes
``register(subparsers)`` (adds its parser and sets ``func``) and a function
``run(args) -> int``. Heavy imports stay inside ``run`` so `tailgate --help`
and `tailgate inspect` start fast.

Errors become a message and an exit status here and nowhere else: a
:class:`~tailgate.errors.TailgateError` carries its own status (2 for usage and
configuration); any other exception is a defect of tailgate and exits 3 with its
traceback, so a crash can never pass for "a red line crossed" (1). The statuses are
listed in ``tailgate.errors``.
"""

from __future__ import annotations

import sys
import traceback

from . import ending
from .commands import COMMAND_MODULES, build_parser  # noqa: F401 (the parser tree, re-exported)
from .errors import EXIT_BUG, EXIT_INTERRUPTED, EXIT_USAGE, TailgateError


def one_line(text: str, limit: int = 400) -> str:
    from .safe import one_line as _one_line

    return _one_line(text, limit)


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["bench", "allreduce"]:
        # A collective is its own launcher-run program with its own options (tailgate.bench.collective).
        from .bench.collective.command import build_parser as collective_parser
        from .commands.bench_allreduce import run as collective_run

        args = collective_parser().parse_args(argv[2:])
        args.command, args.func = "bench allreduce", collective_run
    else:
        args = build_parser().parse_args(argv)
    pages = [k for k in ("html", "sweep_html") if getattr(args, k, None)]
    if pages and args.command != "bench allreduce" and _missing("plotly"):
        # Refused before anything runs (a long bench must not end without its page).
        flag = "--" + pages[0].replace("_", "-")
        print(f"tailgate {args.command}: error: {flag} needs plotly, which a minimal install "
              "leaves out: pip install 'tailgate[html]'", file=sys.stderr)
        return EXIT_USAGE
    ending.install()
    try:
        return int(args.func(args) or 0)
    except ending.Terminated as exc:  # SIGTERM, SIGHUP: every child was killed in the handler
        print(f"tailgate: ended by {exc}", file=sys.stderr)
        return exc.exit_status
    except TailgateError as exc:
        print(f"tailgate {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        print("tailgate: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `tailgate ... | head`: the reader left, nothing more to say
        sys.stderr.close()
        return 0
    except Exception:  # noqa: BLE001 - the one place a crash becomes an exit status
        traceback.print_exc()
        print(f"tailgate {args.command}: internal error (a bug in tailgate: please report it "
              "with the traceback above)", file=sys.stderr)
        return EXIT_BUG
    finally:
        ending.kill_all()  # nothing this run started outlives it (Ctrl-C, an error, a bug)
