"""`tailgate report FILE...`: show saved documents again (terminal, HTML, Markdown, JUnit),
with the renderers of the commands that wrote them; nothing is re-run."""

from __future__ import annotations

import argparse

from ..errors import UsageError
from ..outputs import check_writable, write_output


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="show saved results again (inspect, bench, probe, diagnose, compare, "
        "fleet, sweep JSON) in the terminal, as HTML, Markdown or JUnit",
        description="Render saved tailgate documents without re-running anything: an inspect "
        "report, a bench result of any protocol, a collective, a sweep, a probe summary, a "
        "diagnosis, a comparison or a fleet view.")
    p.add_argument("files", nargs="+", metavar="FILE", help="saved JSON document(s)")
    p.add_argument("--html", metavar="FILE",
                   help="write the HTML page of the document (one FILE only)")
    p.add_argument("--markdown", metavar="FILE|-", help="write a compare document as Markdown")
    p.add_argument("--junit", metavar="FILE|-", help="write an inspect report as JUnit XML")
    p.add_argument("--quiet", action="store_true", help="no terminal output")
    p.add_argument("--all", action="store_true", dest="all_findings",
                   help="print every finding of an inspect report, every cause of a "
                   "diagnosis, in full")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..report.documents import DocumentError, kind, render
    from ..userfiles import UserFileError, load_json

    outputs = {o: getattr(args, o) for o in ("html", "markdown", "junit") if getattr(args, o)}
    if outputs and len(args.files) > 1:
        raise UsageError(f"--{next(iter(outputs))} renders one document: give one FILE")
    check_writable(*outputs.values())
    docs = []
    for path in args.files:
        try:
            doc = load_json(path)
            docs.append((path, kind(doc), doc))
        except UserFileError as exc:
            raise UsageError(str(exc)) from exc
        except DocumentError as exc:
            raise UsageError(f"{path}: {exc}") from exc
    for output, target in outputs.items():
        path, k, doc = docs[0]
        try:
            write_output(target, render(output, k, doc))
        except DocumentError as exc:
            raise UsageError(f"{path}: {exc}") from exc
    if not args.quiet and "-" not in outputs.values():
        from rich.console import Console

        from ..report.documents import terminal

        console = Console(highlight=False, soft_wrap=False)
        for i, (path, k, doc) in enumerate(docs):
            if len(docs) > 1:
                console.print(("\n" if i else "") + f"== {path} ({k}) ==", markup=False,
                              soft_wrap=True)
            try:
                terminal(k, doc, console, args.all_findings)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise UsageError(f"{path}: {k} document of the wrong shape "
                                 f"({type(exc).__name__}: {exc})") from exc
    return 0
