"""Clock synchronisation: linuxptp (pmc, ptp4l/phc2sys logs) and chrony.

* ``pmc -u -b 0 'GET TIME_STATUS_NP'``: one response block per clock that answers,
  headed ``<portIdentity> seq N RESPONSE MANAGEMENT TIME_STATUS_NP``, then
  ``master_offset`` (ns), ``gmPresent`` and ``gmIdentity``. No block at all means
  no ptp4l answered (pmc still exits 0). ``GET PORT_PROPERTIES_NP`` says whether
  the port timestamps in ``HARDWARE`` or ``SOFTWARE``.
* ptp4l/phc2sys log lines (journal): ``master offset -5 s2 freq ... path delay ...``,
  ``CLOCK_REALTIME phc offset 25 s2 freq ... delay ...``, and with
  ``summary_interval`` the ``rms N max N freq ... +/- ...`` form. ``s0`` is
  unlocked, ``s1`` a clock step, ``s2`` locked (``s3`` in newer servo code).
* ``chronyc tracking``: ``Reference ID : 50484330 (PHC0)`` names a reference clock
  (the hex is the ASCII of the refclock name); an IPv4-looking hex with a host name
  is a network NTP server; ``00000000`` is no reference at all. chrony before 3.0
  prints the same ID quad-dotted (``80.72.67.48 (PHC0)``, ``0.0.0.0 ()``).
* pmc prints ``RESPONSE MANAGEMENT_ERROR_STATUS`` when ptp4l refuses a request (an old
  ptp4l asked for PORT_PROPERTIES_NP): such answers are kept as ``"error": True``.
"""

from __future__ import annotations

import re
from typing import Any

from ..collect import Scope, collector
from ..host import Host, Refused, TooLarge
from ..model import ParseError, SourceError
from .records import put

_RESPONSE_RE = re.compile(r"^\s*(\S+)\s+seq\s+[0-9]+\s+RESPONSE\s+MANAGEMENT\s+(\S+)")
_ERROR_RE = re.compile(r"^\s*(\S+)\s+seq\s+[0-9]+\s+RESPONSE\s+MANAGEMENT_ERROR_STATUS\b")


def parse_pmc(text: str) -> list[dict[str, Any]]:
    """All management responses: ``[{"port", "message", "fields": {name: value}}]``; an
    error answer is ``{"port", "message": "MANAGEMENT_ERROR_STATUS", "error": True}``."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    sent = False
    for line in text.splitlines():
        m = _RESPONSE_RE.match(line)
        if m:
            current = {"port": m.group(1), "message": m.group(2), "fields": {}}
            out.append(current)
            continue
        e = _ERROR_RE.match(line)
        if e:
            out.append({"port": e.group(1), "message": "MANAGEMENT_ERROR_STATUS", "fields": {},
                        "error": True})
            current = None
            continue
        if "RESPONSE MANAGEMENT" in line:  # a response we cannot read is not "no answer"
            raise ParseError(f"pmc: malformed response header {line.strip()[:80]!r}")
        if line.lstrip().startswith("sending:"):
            sent, current = True, None
            continue
        parts = line.split(None, 1)
        if current is not None and len(parts) == 2 and line[:1].isspace():
            put(current["fields"], parts[0], parts[1].strip(),
                f"pmc {current['port']} {current['message']}")
    if not sent and not out:
        # pmc always echoes what it sends; without that this is not pmc output.
        raise ParseError("pmc: no 'sending:' line and no response")
    return out


def time_status(responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TIME_STATUS_NP responses as ``{"port", "master_offset_ns", "gm_present", "gm"}``."""
    out = []
    for r in responses:
        if r["message"] != "TIME_STATUS_NP":
            continue
        f = r["fields"]
        try:
            offset = int(f["master_offset"])
        except (KeyError, ValueError) as exc:
            raise ParseError(f"pmc TIME_STATUS_NP: bad master_offset {f.get('master_offset')!r}"
                             ) from exc
        gm = f.get("gmPresent")
        if gm not in ("true", "false"):
            raise ParseError(f"pmc TIME_STATUS_NP: bad gmPresent {gm!r}")
        out.append({"port": r["port"], "master_offset_ns": offset, "gm_present": gm == "true",
                    "gm": f.get("gmIdentity")})
    return _one_answer_per_port(out, "TIME_STATUS_NP")


def _one_answer_per_port(answers: list[dict[str, Any]], message: str) -> list[dict[str, Any]]:
    """One answer per port: a port that answered twice with different values is a broken
    source (which offset is the clock's cannot be told), not "the last one wins"."""
    by_port: dict[str, dict[str, Any]] = {}
    for a in answers:
        put(by_port, a["port"], a, f"pmc {message}: port")
    return list(by_port.values())


# linuxptp's ts_str(): every value PORT_PROPERTIES_NP can print for `timestamping`.
TIMESTAMPING = frozenset({"SOFTWARE", "HARDWARE", "LEGACY_HW", "ONESTEP", "P2P1STEP"})


def port_properties(responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in responses:
        if r["message"] != "PORT_PROPERTIES_NP":
            continue
        ts = r["fields"].get("timestamping")
        if ts not in TIMESTAMPING:
            raise ParseError(f"pmc PORT_PROPERTIES_NP: unknown timestamping {str(ts)[:40]!r}")
        out.append({"port": r["port"], "state": r["fields"].get("portState"),
                    "timestamping": ts, "interface": r["fields"].get("interface")})
    return _one_answer_per_port(out, "PORT_PROPERTIES_NP")


_PROG_RE = re.compile(r"\b(ptp4l|phc2sys)\[")
_MASTER_RE = re.compile(
    r"master offset\s+(-?[0-9]+)\s+s([0-9])\s+freq\s+([+-]?[0-9]+)\s+path delay\s+(-?[0-9]+)")
_PHC_RE = re.compile(
    r"(?:phc|sys) offset\s+(-?[0-9]+)\s+s([0-9])\s+freq\s+([+-]?[0-9]+)\s+delay\s+(-?[0-9]+)")
_OFFSET_LINE_RE = re.compile(r"\b(master|phc|sys) offset\b|\brms\s")
_RMS_RE = re.compile(r"\brms\s+([0-9]+)\s+max\s+([0-9]+)\s+freq\s+([+-]?[0-9]+)\s+\+/-\s+([0-9]+)")


def parse_ptp_log(text: str) -> dict[str, list[dict[str, Any]]]:
    """ptp4l/phc2sys log lines -> offset samples and rms summaries, in log order."""
    samples: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    for line in text.splitlines():
        tag = _PROG_RE.search(line)
        m = _MASTER_RE.search(line)
        if m:
            samples.append({"prog": tag.group(1) if tag else "ptp4l", "kind": "master",
                            "offset_ns": int(m.group(1)), "state": f"s{m.group(2)}",
                            "freq_ppb": int(m.group(3)), "delay_ns": int(m.group(4))})
            continue
        m = _PHC_RE.search(line)
        if m:
            samples.append({"prog": tag.group(1) if tag else "phc2sys", "kind": "phc",
                            "offset_ns": int(m.group(1)), "state": f"s{m.group(2)}",
                            "freq_ppb": int(m.group(3)), "delay_ns": int(m.group(4))})
            continue
        m = _RMS_RE.search(line)
        if m:
            summaries.append({"prog": tag.group(1) if tag else "ptp4l",
                              "rms_ns": int(m.group(1)), "max_ns": int(m.group(2))})
        elif _OFFSET_LINE_RE.search(line):
            # An offset line we cannot read would silently drop the sample that says the
            # servo is unlocked: refuse the journal rather than judge what is left.
            raise ParseError(f"ptp4l/phc2sys journal: malformed offset line {line.strip()[-80:]!r}")
    return {"samples": samples, "summaries": summaries}


_SYSTIME_RE = re.compile(r"^([0-9.]+) seconds (fast|slow) of NTP time$")


def parse_chrony_tracking(text: str) -> dict[str, Any]:
    """``chronyc tracking`` -> reference, its kind, stratum, system clock offset (ns)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(" : ")
        if sep:
            put(fields, key.strip(), value.strip(), "chronyc tracking")
    if "Reference ID" not in fields or "System time" not in fields:
        raise ParseError("chronyc tracking: no 'Reference ID' / 'System time' lines")
    # Text after the closing parenthesis (annotations in copied docs) is ignored.
    m = re.match(r"^([0-9A-Fa-f]{8})\s*\(([^)]*)\)", fields["Reference ID"])
    # chrony < 3.0 prints the reference ID quad-dotted (client.c: "%lu.%lu.%lu.%lu").
    dotted = re.match(r"^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\s*\(([^)]*)\)",
                      fields["Reference ID"])
    if m:
        ref_id, name = m.group(1).upper(), m.group(2)
    elif dotted and all(int(b) < 256 for b in dotted.groups()[:4]):
        ref_id = "".join(f"{int(b):02X}" for b in dotted.groups()[:4])
        name = dotted.group(5)
    else:
        raise ParseError(f"chronyc tracking: bad Reference ID {fields['Reference ID']!r}")
    t = _SYSTIME_RE.match(fields["System time"])
    if not t:
        raise ParseError(f"chronyc tracking: bad System time {fields['System time']!r}")
    offset_ns = float(t.group(1)) * 1e9 * (1 if t.group(2) == "fast" else -1)
    raw = bytes.fromhex(ref_id).rstrip(b"\0")
    ascii_name = raw.decode("ascii") if raw and all(32 < c < 127 for c in raw) else None
    if ref_id == "00000000":
        kind = "none"
    elif ref_id == "7F7F0101":
        kind = "local"  # chrony's `local` directive: the host's own free-running clock
    elif ascii_name is not None and name in (ascii_name, ""):
        kind = "phc" if ascii_name.startswith("PHC") else "refclock"
    else:
        kind = "ntp"
    try:
        stratum = int(fields.get("Stratum", ""))
    except ValueError as exc:
        raise ParseError(f"chronyc tracking: bad Stratum {fields.get('Stratum')!r}") from exc
    leap = fields.get("Leap status", "")
    return {"ref_id": ref_id, "ref_name": name or ascii_name, "kind": kind, "stratum": stratum,
            "offset_ns": round(offset_ns, 3), "leap": leap,
            "synchronised": leap != "Not synchronised" and kind != "none"}


# ---------------------------------------------------------------- collectors


@collector("ptp.pmc")
def ptp_pmc(host: Host, scope: Scope) -> dict[str, Any]:
    responses = parse_pmc(host.run(["pmc", "-u", "-b", "0", "GET TIME_STATUS_NP"]))
    status = time_status(responses)
    if not status and any(r.get("error") for r in responses):
        # ptp4l is there but refused: not the same as no daemon answering.
        raise SourceError("ptp4l answered GET TIME_STATUS_NP with MANAGEMENT_ERROR_STATUS")
    ports: list[dict[str, Any]] = []
    if status:
        try:
            text = host.run(["pmc", "-u", "-b", "0", "GET PORT_PROPERTIES_NP"])
        except SourceError as exc:
            if isinstance(exc, (ParseError, TooLarge, Refused)):
                raise  # an answer that is not pmc's: never read as "no software timestamps"
            text = None  # linuxptp before 2.0 has no PORT_PROPERTIES_NP: the offset still counts
        if text is not None:
            ports = port_properties(parse_pmc(text))
    return {"time_status": status, "ports": ports}


@collector("ptp.log")
def ptp_log(host: Host, scope: Scope) -> dict[str, Any]:
    """The last five minutes of ptp4l/phc2sys journal lines (older lines say nothing
    about the clock now)."""
    try:
        text = host.run(["journalctl", "-q", "--no-pager", "-o", "short", "--since=-5min",
                         "-t", "ptp4l", "-t", "phc2sys"])
    except (ParseError, TooLarge, Refused):
        raise  # a journal that is there but broken: the fact is missing, the check unknown
    except SourceError as exc:
        # No journal here (no systemd, no journalctl): nothing to add to pmc's answer.
        return {"samples": [], "summaries": [], "unavailable": str(exc)}
    return parse_ptp_log(text)


@collector("chrony.tracking")
def chrony_tracking(host: Host, scope: Scope) -> dict[str, Any]:
    return parse_chrony_tracking(host.run(["chronyc", "tracking"]))
