"""Saved documents shown again: what kind a JSON document is, and each kind rendered by the
renderer its own command uses (``tailgate report``). Nothing is re-run or re-judged.

Kinds: an inspect report (``--json``), a bench result of every protocol
(``tailgate_bench``; ``openai+`` runs carry their token figures), a collective
(``tailgate_collective``), a sweep (``tailgate_sweep``), a probe summary (``probe``),
diagnose (``tailgate_diagnose``), compare (``tailgate_compare``) and an inspect fleet view
(``tailgate_fleet``). A snapshot (``inspect --save``) holds facts, not a verdict: it is
judged with ``inspect --from``.
"""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from ..model import Finding, Report, Verdict
from .bench_text import _fmt_ci, _fmt_row, _llm_rows

KINDS = ("inspect report (inspect --json)", "bench result (http, https, tcp, grpc, openai+)",
         "collective (bench allreduce)", "sweep (bench --sweep)", "probe summary (probe --json)",
         "diagnose", "compare", "fleet (inspect --ray)")
# what each output can render; a kind not listed for an output is refused for it
OUTPUTS = {"terminal": {"inspect", "bench", "collective", "sweep", "probe", "diagnose",
                        "compare", "fleet"},
           "html": {"inspect", "bench", "collective", "sweep", "diagnose", "compare"},
           "markdown": {"compare"},
           "junit": {"inspect"}}


class DocumentError(InputError):
    """A document this command cannot read (the message names what it reads)."""


def kind(doc: Any) -> str:
    if not isinstance(doc, dict):
        raise DocumentError("not a tailgate document (expected a JSON object)")
    for key, name in (("tailgate_bench", "bench"), ("tailgate_collective", "collective"),
                      ("tailgate_sweep", "sweep"), ("tailgate_diagnose", "diagnose"),
                      ("tailgate_compare", "compare"), ("tailgate_fleet", "fleet")):
        if key in doc:
            return name
    if "findings" in doc and "verdict" in doc:
        return "inspect"
    if isinstance(doc.get("probe"), str):
        return "probe"
    if doc.get("tailgate_snapshot") == 1:
        raise DocumentError("a snapshot (inspect --save): facts, not a verdict; judge it "
                            "with `tailgate inspect --from FILE`")
    raise DocumentError("not a tailgate document; `tailgate report` reads: " + ", ".join(KINDS))


def report_from_json(data: dict[str, Any]) -> Report:
    """An inspect report (``inspect --json``) as the Report its renderers take."""
    try:
        findings = tuple(Finding(**{k: f[k] for k in Finding.__dataclass_fields__})
                         for f in data["findings"])
        v = data["verdict"]
        verdict = Verdict(**{k: (tuple(v[k]) if isinstance(v.get(k), list) else v[k])
                             for k in Verdict.__dataclass_fields__ if k in v})
        return Report(version=str(data.get("tailgate") or ""), host=dict(data.get("host") or {}),
                      target=dict(data.get("target") or {}),
                      interval_s=float(data.get("interval_s") or 0.0),
                      taken_at=float(data.get("taken_at") or 0.0), verdict=verdict,
                      findings=findings, platform=dict(data.get("platform") or {}))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DocumentError(f"an inspect report of the wrong shape ({type(exc).__name__}: "
                            f"{exc})") from None


def _rows(doc: dict[str, Any]):
    from ..compare import Row

    fields = Row.__dataclass_fields__
    return [Row(**{k: (tuple(r[k]) if isinstance(r.get(k), list) else r[k])
                   for k in fields if k in r}) for r in doc["rows"]]


def bench_text(doc: dict[str, Any]) -> str:
    """A saved bench result's table, from the JSON alone (the run's own summary needs the
    live run's settings: this one prints what the document holds)."""

    req, rate = doc["requests"], doc.get("rate") or {}
    errs = ", ".join(f"{k} {v}" for k, v in (req.get("errors") or {}).items() if v) or "none"
    cols = [k for k in ("p50", "p90", "p95", "p99", "p999", "p9999") if k in doc["latency_ms"]]
    lines = [f"tailgate bench {doc.get('target')}  ({doc.get('protocol', '')}, "
             f"{doc.get('duration_s', 0):g} s)" + ("  [INTERRUPTED]" if doc.get("interrupted")
                                                   else ""),
             f"requests: sent {req.get('sent')}, ok {req.get('ok')}, errors: {errs}",
             f"rate: target {rate.get('target')}/s, achieved {rate.get('achieved')}/s", "",
             f"{'':<14}" + "".join(f"{k:>10}" for k in (*cols, "max")) + f"{'count':>10}"]
    for key, label in (("latency_ms", "latency ms"), ("service_time_ms", "service ms"),
                       ("lateness_ms", "lateness ms")):
        if key in doc:
            lines.append(_fmt_row(label, doc[key], cols))
    lines += _llm_rows(doc, cols)
    for key, label in (("latency_ms", "latency"), ("service_time_ms", "service")):
        if key in doc:
            lines.append(_fmt_ci(label, doc[key], cols))
    for w in doc.get("warnings") or []:
        lines.append(f"warning: {w}")
    for s in doc.get("slo") or []:
        lines.append(f"SLO {s['expr']}: {'pass' if s.get('pass') else 'FAIL'}"
                     + (f" (observed {s.get('observed')})" if s.get("observed") is not None
                        else ""))
    return "\n".join(lines)


def _points(doc: dict[str, Any]):
    from ..plan.sweep import Point

    return [Point.from_json(p) for p in doc["points"]]


def terminal(k: str, doc: dict[str, Any], console, every: bool = False) -> None:
    """``doc`` (of kind ``k``) on the terminal; ``every``: an inspect report's every finding,
    a diagnosis's every cause, in full."""
    if k == "inspect":
        from .terminal import print_report

        print_report(report_from_json(doc), console, all_findings=every)
    elif k == "bench":
        console.print(bench_text(doc), markup=False, highlight=False, soft_wrap=True)
    elif k == "collective":
        from .collective_render import summary_text

        console.print(summary_text(doc), markup=False, highlight=False, soft_wrap=True)
    elif k == "sweep":
        from .sweep_render import summary

        pts = _points(doc)
        top = next((p for p in pts if doc.get("max_rate_meeting_slo")
                    and p.rate == doc["max_rate_meeting_slo"].get("rate")), None)
        knee = next((p for p in pts if doc.get("knee") and p.rate == doc["knee"].get("rate")),
                    None)
        console.print(summary(pts, top, knee, bool(doc.get("slo")), doc.get("knee_reason", "")),
                      markup=False, highlight=False, soft_wrap=True)
    elif k == "probe":
        from .probe_render import print_summary

        print_summary(doc, console)
    elif k == "diagnose":
        from .diagnose_render import terminal as diagnose_terminal

        diagnose_terminal(doc, console, all_causes=every)
    elif k == "compare":
        from .compare_render import terminal as compare_terminal

        compare_terminal(doc, _rows(doc), console)
    elif k == "fleet":
        from .fleet_render import fleet_text

        console.print(fleet_text(doc), markup=False, highlight=False, soft_wrap=True)


def _a(k: str) -> str:
    return ("an " if k[0] in "aeiou" else "a ") + k


def render(output: str, k: str, doc: dict[str, Any]) -> str:
    """The document as ``output`` (html, markdown, junit)."""
    if k not in OUTPUTS[output]:
        fits = ", ".join(sorted(OUTPUTS[output]))
        raise DocumentError(f"--{output} does not fit {_a(k)} document (it renders: {fits})")
    if output == "junit":
        from .junit import render_junit

        return render_junit(report_from_json(doc))
    if output == "markdown":
        from .compare_render import markdown

        return markdown(doc, _rows(doc))
    if k == "inspect":
        from .html import render_html

        return render_html(report_from_json(doc))
    if k == "bench":
        from .bench_html import bench_page

        return bench_page(doc)
    if k == "collective":
        from .collective_render import render_html

        return render_html(doc)
    if k == "sweep":
        from .sweep_render import html

        pts = _points(doc)
        top = next((p for p in pts if doc.get("max_rate_meeting_slo")
                    and p.rate == doc["max_rate_meeting_slo"].get("rate")), None)
        knee = next((p for p in pts if doc.get("knee") and p.rate == doc["knee"].get("rate")),
                    None)
        return html(str(doc.get("target")), pts, top, knee)
    if k == "diagnose":
        from .diagnose_html import diagnose_page

        return diagnose_page(doc)
    from .compare_render import html_page  # compare: the table (no spectra: not saved in it)

    return html_page(doc, _rows(doc), {})
