"""ethtool: driver info, FEC statistics, module EEPROM, RSS, rings, timestamping.

Each output has a pure parser (text in, value out) tested on real captures from
``shared/corpus/host``; the collectors only run ``ethtool`` through the Host.
A driver that does not implement an operation (virtio has no FEC, no module
EEPROM) is data, not a failure: the value says ``supported: False`` and why,
so the check can say "not applicable" instead of "could not read".

Formats read: every release from 5.0 to 7.0 (one fixture per print-code variant in
tests/fixtures/host/versions, each naming the release and function it comes from):

* ``-I --show-fec``: ``Statistics:`` then ``  corrected_blocks: N`` with optional
  ``    Lane K: N`` lines (netlink/fec.c, 5.13 .. 6.15), or ``N [ per_lane: a, b ]`` and
  the ``fec_symbols_err_*`` histogram (6.19+); no statistics before 5.13.
* ``-S``: ``     name: value`` under ``NIC statistics:``.
* ``-m``: ``Field   : value`` lines; field names differ between SFF-8472 (SFP),
  SFF-8636 (QSFP) and CMIS (QSFP-DD/OSFP) decoders and across ethtool versions
  (``Rcvr signal avg optical power(Channel 1)`` vs ``... (Channel 1)``).
* ``-x``: indirection table, ``RSS hash key:`` as colon-separated hex, the hash
  functions, and since ethtool 6.8 ``RSS input transformation: symmetric-xor``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..collect import Scope, collector
from ..host import Host
from ..model import ParseError, SourceError
from .netdev import per_iface
from .records import is_uint, put

UNSUPPORTED = "Operation not supported"

# Driver counters that stand in for the generic FEC statistics, per driver.
# mlx5: rx_symbol_err_phy counts symbol errors FEC could not correct (or FEC off);
#   rx_corrected_bits_phy the bits it corrected; rx_err_lane_N_phy raw pre-FEC errors.
# bnxt_en: rx_fec_uncorrectable_blocks / rx_fec_corrected_blocks (port stats ext).
DRIVER_FEC = {
    "mlx5_core": {"uncorrectable": "rx_symbol_err_phy", "corrected": "rx_corrected_bits_phy"},
    "bnxt_en": {"uncorrectable": "rx_fec_uncorrectable_blocks",
                "corrected": "rx_fec_corrected_blocks"},
}
# Counters kept from `ethtool -S` (the rest is not ours to store): FEC and lane
# errors, and mlx5's PCIe signal-integrity counters (PCIe PHY errors seen by the NIC).
_PHY_COUNTER_RE = re.compile(
    r"fec|symbol_err|corrected_bits|err_lane_[0-9]+|pci_signal_integrity|outbound_pci_stalled"
)


def _unsupported(text: str) -> bool:
    return UNSUPPORTED in text


# ---------------------------------------------------------------- parsers


def parse_driver_info(text: str) -> dict[str, str]:
    """``ethtool -i``: ``key: value`` lines."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and " " not in key.strip():
            put(out, key.strip(), value.strip(), "ethtool -i")
    if "driver" not in out:
        raise ParseError("ethtool -i: no 'driver:' line")
    return out


_STAT_RE = re.compile(r"^\s*([^:\s][^:]*):\s*(-?[0-9]+)\s*$", re.ASCII)


def parse_stats(text: str) -> dict[str, int]:
    """``ethtool -S``: ``name: integer`` lines; other lines are ignored."""
    out: dict[str, int] = {}
    header = False
    for line in text.splitlines():
        if line.strip() == "NIC statistics:":
            header = True
            continue
        m = _STAT_RE.match(line)
        if m:
            put(out, m.group(1).strip(), int(m.group(2)), "ethtool -S")
        elif header and re.match(r"^\s+[^:\s][^:]*:\s*\S+\s*$", line):
            # every ethtool -S value is an integer: anything else is not a statistic
            raise ParseError(f"ethtool -S: not a counter: {line.strip()[:60]!r}")
    if not out and not header:
        raise ParseError("ethtool -S: no statistics")
    return out


def phy_counters(stats: dict[str, int]) -> dict[str, int]:
    kept = {k: v for k, v in stats.items() if _PHY_COUNTER_RE.search(k)}
    negative = [k for k, v in kept.items() if v < 0]
    if negative:  # error counters only count up: a negative one is garbage, not a rate
        raise ParseError(f"ethtool -S: negative counter {negative[0]}: {kept[negative[0]]}")
    return kept


_FEC_CONFIG = ("Configured FEC encodings", "Supported/Configured FEC encodings")
# One statistic: ``name: total`` and, from ethtool 6.19, `` [ per_lane: a, b ]`` after it.
# 6.19 prints a lane-less total without its newline, so several can share one line.
_FEC_ITEM_RE = re.compile(r"(\w+):\s*(\S+?)(?:\s*\[\s*per_lane:([^\]]*)\])?(?=\s|$)")
# 5.13 .. 6.15: per-lane values on their own ``    Lane N: count`` lines.
_FEC_LANE_RE = re.compile(r"^\s+Lane ([0-9]+):\s+(\S+)\s*$")
_FEC_HIST_RE = re.compile(r"^fec_symbols_err_([0-9]+)(?:_to_([0-9]+))?$")


def _fec_count(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]{1,20}", text):  # ASCII: str.isdigit() also takes '²'
        raise ParseError(f"ethtool --show-fec: {name}: not a count: {text[:40]!r}")
    return int(text)


def _fec_stat_line(line: str, out: dict[str, Any]) -> str | None:
    """Read the statistics on one line into ``out``; the last statistic's name, if any."""
    last, found = None, False
    for m in _FEC_ITEM_RE.finditer(line):
        found = True
        name, total = m.group(1), _fec_count(m.group(1), m.group(2))
        lanes: dict[str, int] = {}
        if m.group(3) is not None:
            values = [v.strip() for v in m.group(3).split(",")]
            lanes = {str(i): _fec_count(f"{name} lane {i}", v) for i, v in enumerate(values)}
        where = "ethtool --show-fec"
        hist = _FEC_HIST_RE.match(name)
        if hist:
            lo = int(hist.group(1))
            hi = int(hist.group(2)) if hist.group(2) else lo
            entry = {"symbol_errors": [lo, hi], "total": total, "lanes": lanes}
            if any(h["symbol_errors"] == [lo, hi] and h != entry for h in out["histogram"]):
                raise ParseError(f"{where}: {name} appears twice with different values: "
                                 "a broken source")
            if entry not in out["histogram"]:
                out["histogram"].append(entry)
            last = None
        else:
            put(out["stats"], name, {"total": total, "lanes": lanes}, where)
            last = name
    if not found:
        raise ParseError(f"ethtool --show-fec: unreadable statistics line: {line.strip()!r}")
    return last


def parse_fec(text: str) -> dict[str, Any]:
    """``ethtool [-I] --show-fec``: encodings and (when the driver reports them) statistics.

    ``stats`` maps ``corrected_blocks``/``uncorrectable_blocks``/``corrected_bits`` to
    ``{"total": N, "lanes": {"0": N, ...}}``; it is empty when the driver reports none
    (and always before ethtool 5.13, whose ioctl path prints no statistics).
    ``histogram`` lists the FEC symbol-error bins of ethtool >= 6.19
    (``{"symbol_errors": [lo, hi], "total", "lanes"}``). Every print format of ethtool
    5.0 .. 7.0 is read: ``Configured`` (< 5.18) or ``Supported/Configured`` encodings,
    ``    Lane N: count`` lines (5.13 .. 6.15) or ``[ per_lane: ... ]`` (6.19+).
    """
    if _unsupported(text) and "FEC parameters" not in text:
        return {"supported": False, "reason": f"ethtool --show-fec: {UNSUPPORTED}"}
    if "FEC parameters" not in text:
        raise ParseError("ethtool --show-fec: no 'FEC parameters' header")
    out: dict[str, Any] = {"supported": True, "configured": None, "active": None, "stats": {},
                           "histogram": []}
    in_stats = False
    current: str | None = None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        k = key.strip()
        if not line.strip():
            continue
        if k in _FEC_CONFIG:
            out["configured"] = value.split()
        elif k == "Active FEC encoding":
            out["active"] = value.strip() or None
        elif k == "Statistics" and not value.strip():
            in_stats = True
        elif in_stats:
            lane = _FEC_LANE_RE.match(line)
            if lane:
                if current is None:
                    raise ParseError(f"ethtool --show-fec: lane line before a statistic: {line!r}")
                put(out["stats"][current]["lanes"], lane.group(1), _fec_count(
                    f"{current} lane {lane.group(1)}", lane.group(2)),
                    f"ethtool --show-fec: {current} lane")
            else:
                current = _fec_stat_line(line, out)
    return out


_FIELD_RE = re.compile(r"^\s*([A-Za-z][^:]*?)\s*:\s?(.*)$")
_RX_POWER_RE = re.compile(
    r"^(Rcvr signal avg optical power|Receiver signal average optical power|"
    r"Receiver signal OMA|Rcvr signal OMA)\s*(?:\((?:Channel|Chan) ([0-9]+)\))?$"
)
_RX_POWER_NAME_RE = re.compile(r"^(Rcvr signal|Receiver signal)")
_POWER_VALUE_RE = re.compile(r"^([0-9.]+)\s*mW\s*/\s*(-inf|[-+]?[0-9.]+)\s*dBm")
# ethtool prints 0.0001 mW (-40 dBm) for the smallest non-zero reading: no light.
LOS_DBM = -40.0


# Per-lane status lines (sff-common.c sff_show_lane_status, SFF-8636 and CMIS, ethtool
# >= 6.4): ``None`` or ``[ No, Yes, ... ]`` with lane 1 first. The flags are latched:
# set when the condition happened since the module was last read.
LANE_FLAGS = {"Rx loss of signal": "rx_los", "Rx loss of lock": "rx_lol",
              "Tx loss of signal": "tx_los", "Tx loss of lock": "tx_lol", "Tx fault": "tx_fault"}
_RX_THRESHOLD_RE = re.compile(r"^Laser rx power (high|low) (alarm|warning) threshold$")


def _length_m(value: str) -> float | None:
    """``1m``, ``3.00m`` (CMIS, < 6.14), ``3.0000m`` (6.14+), ``2km``; ``> 6.3km`` (CMIS's
    largest code) reads as its lower bound."""
    m = re.match(r"^\s*>?\s*([0-9]+(?:\.[0-9]+)?)\s*(km|m)\b", value)
    if not m:
        return None
    return float(m.group(1)) * (1000.0 if m.group(2) == "km" else 1.0)


def _lane_flags(name: str, value: str) -> list[int]:
    """``[ No, Yes, No, No ]`` -> ``[2]`` (flagged lanes, numbered from 1); ``None`` -> []."""
    if value == "None":
        return []
    m = re.fullmatch(r"\[\s*((?:(?:Yes|No)\s*,?\s*)+)\]", value)
    if not m:
        raise ParseError(f"ethtool -m: {name}: not a lane list: {value!r}")
    words = [w.strip() for w in m.group(1).split(",") if w.strip()]
    return [i + 1 for i, w in enumerate(words) if w == "Yes"]


def _rx_power(name: str, value: str) -> dict[str, Any] | None:
    """One ``ethtool -m`` field as a received-power reading, or None if it is not one."""
    pm = _RX_POWER_RE.match(name)
    if not pm:
        if _RX_POWER_NAME_RE.match(name):  # a power field whose lane we cannot read
            raise ParseError(f"ethtool -m: malformed power field {name[:60]!r}")
        return None
    v = _POWER_VALUE_RE.match(value)
    if not v:
        raise ParseError(f"ethtool -m: {name}: not a power reading: {value!r}")
    dbm = None if v.group(2) == "-inf" else float(v.group(2))
    mw = float(v.group(1))
    # A module reads 0 .. 6.5535 mW (a 16-bit field of 0.1 uW): beyond a watt, or a dBm
    # outside -60 .. +30, is a corrupt EEPROM or capture, never light on a fiber.
    if dbm is not None and not (math.isfinite(dbm) and -60.0 <= dbm <= 30.0):
        raise ParseError(f"ethtool -m: {name}: implausible dBm {v.group(2)[:20]!r}")
    if not (math.isfinite(mw) and 0.0 <= mw <= 1000.0):
        raise ParseError(f"ethtool -m: {name}: implausible power {v.group(1)[:20]!r} mW")
    return {"lane": int(pm.group(2)) if pm.group(2) else 1, "mw": mw, "dbm": dbm,
            "kind": "oma" if "OMA" in pm.group(1) else "avg"}


def parse_rx_power(text: str) -> list[dict[str, Any]]:
    """Every received-power line of ``ethtool -m`` output (or a grep of it)."""
    out = []
    for line in text.splitlines():
        m = _FIELD_RE.match(line)
        reading = _rx_power(m.group(1).strip(), m.group(2).strip()) if m else None
        if reading is not None:
            out.append(reading)
    return out


def parse_module(text: str) -> dict[str, Any]:
    """``ethtool -m``: identity, media, cable length and per-lane received power.

    ``rx_power`` is a list of ``{"lane", "mw", "dbm", "kind"}``; ``dbm`` is None for
    ``-inf`` (no light). ``media`` is ``copper``, ``optical`` or ``unknown``;
    ``cable_length_m`` is the attached cable's length (copper or active cables only).
    ``lane_flags`` maps ``rx_los``/``rx_lol``/``tx_los``/``tx_lol``/``tx_fault`` to the
    flagged lanes (numbered from 1) where the module and the ethtool release report them;
    ``rx_thresholds_dbm`` holds the module's own Rx power alarm/warning thresholds.
    Labels of every ethtool release 5.x .. 7.0 are read (6.14 renamed several, e.g.
    ``Length (OM3 50um)`` -> ``Length (OM3)`` and ``power(Channel 1)`` -> ``power (Channel 1)``).
    """
    if _unsupported(text) and "Identifier" not in text:
        return {"supported": False, "reason": f"ethtool -m: {UNSUPPORTED}"}
    fields: dict[str, list[str]] = {}
    rx: list[dict[str, Any]] = []
    flags: dict[str, list[int]] = {}
    rx_thresholds: dict[str, float | None] = {}
    for line in text.splitlines():
        m = _FIELD_RE.match(line)
        if not m:
            continue
        name, value = m.group(1).strip(), m.group(2).strip()
        reading = _rx_power(name, value)
        threshold = _RX_THRESHOLD_RE.match(name)
        if reading is not None:
            if any((r["kind"], r["lane"]) == (reading["kind"], reading["lane"])
                   and r != reading for r in rx):
                raise ParseError(f"ethtool -m: {name} (lane {reading['lane']}) appears twice "
                                 "with different values: a broken source")
            if reading not in rx:
                rx.append(reading)
        elif name in LANE_FLAGS:
            put(flags, LANE_FLAGS[name], _lane_flags(name, value), "ethtool -m")
        elif threshold:
            v = _POWER_VALUE_RE.match(value)
            if not v:
                raise ParseError(f"ethtool -m: {name}: not a power reading: {value!r}")
            put(rx_thresholds, f"{threshold.group(2)}_{threshold.group(1)}",
                None if v.group(2) == "-inf" else float(v.group(2)), "ethtool -m")
        else:
            fields.setdefault(name, []).append(value)
    if "Identifier" not in fields:
        if re.search(r"^Offset\s+Values\s*$", text, re.M):
            # ethtool's fallback for a memory map it cannot decode (eeprom_dump_hex).
            raise ParseError("ethtool -m: this ethtool prints the module EEPROM as a hex dump "
                             "only (identifier not decoded by this release)")
        raise ParseError("ethtool -m: no 'Identifier' field")

    def first(name: str) -> str | None:
        vals = fields.get(name)
        return vals[0] if vals else None

    tech = first("Transmitter technology")
    connector = first("Connector") or ""
    types = fields.get("Transceiver type", [])
    copper = (
        (tech is not None and "copper" in tech.lower())
        or "copper pigtail" in connector.lower()
        or any("passive cable" in t.lower() or "active cable" in t.lower() for t in types)
    )
    optical = not copper and (
        tech is not None
        or "Laser wavelength" in fields
        or any(re.search(r"Base-(SR|LR|ER|ZR|DR|FR|LX|SX)", t) for t in types)
    )
    attached = "no separable connector" in connector.lower() or "copper pigtail" in connector.lower()
    # SFF-8636 / SFF-8472 (6.14+ prints the SFP's as "Copper or Active cable"), and CMIS's
    # "Cable assembly length" for copper and active (optical or electrical) cables.
    cable = (first("Length (Copper or Active cable)") or first("Length (Copper)")
             or first("Cable assembly length"))
    lengths = {k[len("Length ("):-1]: v[0] for k, v in fields.items()
               if k.startswith("Length (") and k.endswith(")")}
    return {
        "supported": True,
        "identifier": first("Identifier"),
        "connector": connector or None,
        "transmitter_technology": tech,
        "transceiver_types": types,
        "media": "copper" if copper else "optical" if optical else "unknown",
        # An optical module without a separable connector is an active optical cable.
        "attached_cable": attached,
        "cable_length_m": _length_m(cable) if (cable and (copper or attached)) else None,
        "lengths": lengths,
        "vendor": first("Vendor name"),
        "part": first("Vendor PN"),
        "rx_power": rx,
        # Only what this module and ethtool release print (SFF-8636/CMIS, ethtool >= 6.4).
        "lane_flags": flags,
        "rx_thresholds_dbm": rx_thresholds,
    }


_RINGS_RE = re.compile(r"^\s*(RX|RX Mini|RX Jumbo|TX)\s*:\s*(\S+)\s*$")


def parse_rings(text: str) -> dict[str, dict[str, int | None]]:
    """``ethtool -g``: pre-set maximums and current ring sizes (None for n/a)."""
    out: dict[str, dict[str, int | None]] = {}
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("Pre-set maximums"):
            section = "max"
            continue
        if s.startswith("Current hardware settings"):
            section = "current"
            continue
        m = _RINGS_RE.match(line)
        if m and section:
            value = m.group(2)
            if value == "n/a":
                put(out.setdefault(section, {}), m.group(1), None, f"ethtool -g {section}")
            elif re.fullmatch(r"[0-9]{1,10}", value):
                put(out.setdefault(section, {}), m.group(1), int(value), f"ethtool -g {section}")
            else:
                raise ParseError(f"ethtool -g: {m.group(1)}: not a size: {value!r}")
    if "current" not in out:
        raise ParseError("ethtool -g: no 'Current hardware settings'")
    return out


def parse_timestamping(text: str) -> dict[str, Any]:
    """``ethtool -T``: capabilities, PHC index, hardware modes. ``hardware`` says whether
    the NIC timestamps in hardware and exposes a PTP hardware clock (what ptp4l needs).

    Read for every release: the ioctl labels with ``(SOF_TIMESTAMPING_...)`` (< 5.8), the
    netlink names (5.8+), ``Statistics:`` (6.10+), ``Hardware timestamp provider index``
    in place of ``PTP Hardware Clock`` (6.14+) and ``Hardware timestamp source`` (6.19+)."""
    caps: list[str] = []
    tx: list[str] = []
    rxf: list[str] = []
    phc: int | None = None
    phc_seen = False
    section: list[str] | None = None
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        key, sep, value = s.partition(":")
        if s.startswith("Capabilities:"):
            section = caps
        elif s.startswith("Hardware Transmit Timestamp Modes:"):
            section = tx
            if value.strip() == "none":
                section = None
        elif s.startswith("Hardware Receive Filter Modes:"):
            section = rxf
            if value.strip() == "none":
                section = None
        elif key in ("PTP Hardware Clock", "Hardware timestamp provider index"):
            phc_seen = True
            v = value.strip()
            if is_uint(v) and len(v) <= 10:
                phc = int(v)
            elif v not in ("none", "-1"):
                raise ParseError(f"ethtool -T: {key}: {v!r}")
            section = None
        elif s.startswith("Time stamping parameters"):
            section = None
        elif not line[:1].isspace():
            # Another header we do not read: "Statistics:" (6.10+), "Hardware timestamp
            # provider qualifier/source" (6.14+, 6.19+); what is indented under it is not ours.
            section = None
        elif section is not None and line[:1].isspace():
            section.append(s.split()[0])
    if not phc_seen:
        raise ParseError("ethtool -T: no 'PTP Hardware Clock' line")
    hardware = "hardware-transmit" in caps and "hardware-receive" in caps and phc is not None
    return {"capabilities": caps, "phc_index": phc, "tx_modes": tx, "rx_filters": rxf,
            "hardware": hardware}


_RSS_HEADER_RE = re.compile(r"with ([0-9]+) RX ring\(s\)")
_KEY_RE = re.compile(r"^\s*([0-9a-fA-F]{2}(?::[0-9a-fA-F]{2})+)\s*$")
_TABLE_RE = re.compile(r"^\s*[0-9]+:\s+((?:[0-9]+\s*)+)$")
_ONOFF_RE = re.compile(r"^\s*([\w-]+):\s*(on|off)\s*$")
# ethtool >= 6.14 names bits its string set does not know instead of dropping them.
_RSS_UNKNOWN_RE = re.compile(
    r"^\s*Unknown (?:hash function|bits in RSS input transformation):\s*0x([0-9a-fA-F]+)\s*$")


def parse_rss(text: str) -> dict[str, Any]:
    """``ethtool -x``: RX rings, indirection table, key bytes (hex, or None when the
    driver does not expose it), hash functions and input transformations.

    Every release's layout is read: the ioctl print of 5.x-6.1, the leading blank line of
    the netlink print (6.2+), ``RSS input transformation`` (6.9+, ``symmetric-or-xor``
    from 6.15) and the ``Unknown ...: 0xN`` lines of 6.14+ (``unknown_bits``, by section:
    ``functions``/``transforms``)."""
    rings = None
    table: list[int] = []
    key: str | None = None
    functions: dict[str, bool] = {}
    transforms: dict[str, bool] = {}
    unknown: dict[str, int] = {}
    section = None
    for line in text.splitlines():
        s = line.strip()
        m = _RSS_HEADER_RE.search(line)
        if m and "indirection table" in line:
            rings = int(m.group(1))
            section = "table"
            continue
        if s.startswith("RSS hash key:"):
            section = "key"
            continue
        if s.startswith("RSS hash function:"):
            section = "functions"
            continue
        if s.startswith("RSS input transformation:"):
            section = "transforms"
            continue
        if section == "table" and _TABLE_RE.match(line):
            table += [int(x) for x in line.split(":", 1)[1].split()]
        elif section == "key" and _KEY_RE.match(line):
            key = s.replace(":", "").lower()
        elif section in ("functions", "transforms"):
            o = _ONOFF_RE.match(line)
            u = _RSS_UNKNOWN_RE.match(line)
            if o:
                put(functions if section == "functions" else transforms, o.group(1),
                    o.group(2) == "on", f"ethtool -x {section}")
            elif u:
                put(unknown, section, int(u.group(1), 16), "ethtool -x unknown bits")
    if rings is None:
        raise ParseError("ethtool -x: no 'RX flow hash indirection table ... RX ring(s)' header")
    return {"rings": rings, "table": table, "key": key, "functions": functions,
            "transforms": transforms, "unknown_bits": unknown}


# ---------------------------------------------------------------- collectors


def _run_or_unsupported(host: Host, argv: list[str]) -> str:
    """Run ethtool; an 'Operation not supported' exit becomes that text, not an error."""
    try:
        return host.run(argv)
    except SourceError as exc:
        if UNSUPPORTED in str(exc):
            return f"netlink error: {UNSUPPORTED}"
        raise


@collector("ethtool.info", multi=True)
def ethtool_info(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("ethtool.info", host, scope,
                      lambda i: parse_driver_info(host.run(["ethtool", "-i", i])))


def _show_fec(host: Host, iface: str) -> str:
    """``ethtool -I --show-fec``; ethtool before 5.10 refuses ``-I`` ("bad command line
    argument(s)") and prints no statistics anyway, so it is asked without it."""
    try:
        return _run_or_unsupported(host, ["ethtool", "-I", "--show-fec", iface])
    except SourceError as exc:
        try:
            return _run_or_unsupported(host, ["ethtool", "--show-fec", iface])
        except SourceError:
            raise exc from None


@collector("ethtool.fec", counter=True, multi=True)
def ethtool_fec(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("ethtool.fec", host, scope, lambda i: parse_fec(_show_fec(host, i)))


@collector("ethtool.phy", counter=True, multi=True)
def ethtool_phy(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("ethtool.phy", host, scope,
                      lambda i: phy_counters(parse_stats(host.run(["ethtool", "-S", i]))))


@collector("ethtool.module", multi=True)
def ethtool_module(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("ethtool.module", host, scope,
                      lambda i: parse_module(_run_or_unsupported(host, ["ethtool", "-m", i])))


@collector("ethtool.rss", multi=True)
def ethtool_rss(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("ethtool.rss", host, scope,
                      lambda i: parse_rss(host.run(["ethtool", "-x", i])))


@collector("ethtool.rings", multi=True)
def ethtool_rings(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("ethtool.rings", host, scope,
                      lambda i: parse_rings(host.run(["ethtool", "-g", i])))


@collector("ethtool.ts", multi=True)
def ethtool_ts(host: Host, scope: Scope) -> dict[str, object]:
    return per_iface("ethtool.ts", host, scope,
                      lambda i: parse_timestamping(host.run(["ethtool", "-T", i])))
