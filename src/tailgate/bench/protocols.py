"""The protocol registry: every wire protocol ``tailgate bench`` speaks, by URL scheme.

A protocol is one module (``http``, ``tcp``, ``grpc``, ``openai_sse``) that ends with
``BENCH_PROTOCOL = Protocol(...)``: its schemes, the request options it reads, its error
kinds, how its target's bytes are built and its connection for the Python engine (the
module's asyncio protocol over its sans-I/O codec). The flag table, "does not apply to
this protocol", the JSON's error kinds and the compiled engine's reach all come from
here. Adding a protocol: write its module and its tests, and name the module in
:data:`MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..errors import UsageError

MODULES = ("http", "tcp", "grpc", "openai_sse", "udp")  # under tailgate.bench, or dotted names


@dataclass(frozen=True, eq=False)  # one object per protocol: compared by identity
class Protocol:
    """One wire protocol. ``kind`` is the Target's kind; ``schemes`` maps each URL scheme
    to whether it is TLS; ``flags`` are the request options it reads (every load, limit and
    output option applies to all); ``compiled`` whether fastloop.c speaks its
    schemes (TLS ones included)."""

    kind: str
    schemes: dict[str, bool]
    usage: str  # the URL form, for messages: "http(s)://host:port/path"
    flags: tuple[str, ...]
    kinds: tuple[str, ...]  # the error kinds its requests can end with (the JSON lists these)
    default_timeout: str
    target: Callable[..., Any]  # (url, secure, RequestOptions) -> Target
    connections: Callable[[Any, Any], Callable[[], Any]]  # (engine, cfg) -> new connection
    parse_slo: Callable[[str], Any]  # its --slo expressions (LLM targets add ttft_...)
    compiled: bool = False
    tokens: bool = False  # streamed tokens: the engine keeps a TokenBook (TTFT, ITL, ...)

    @property
    def label(self) -> str:
        """The scheme users write first (``openai+http``)."""
        return next(iter(self.schemes))


@cache
def registry() -> dict[str, Protocol]:
    """Every protocol, by scheme."""
    out: dict[str, Protocol] = {}
    for name in MODULES:
        module = importlib.import_module(name if "." in name else f"{__package__}.{name}")
        proto: Protocol = module.BENCH_PROTOCOL
        for scheme in proto.schemes:
            if scheme in out:
                raise AssertionError(f"scheme {scheme}:// registered twice")
            out[scheme] = proto
    return out


def protocols() -> tuple[Protocol, ...]:
    return tuple(dict.fromkeys(registry().values()))


def by_kind(kind: str) -> Protocol:
    for proto in protocols():
        if proto.kind == kind:
            return proto
    raise KeyError(kind)


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def protocol_of(url: str) -> Protocol:
    """The protocol of ``url``'s scheme, else a usage error listing the forms."""
    proto = registry().get(scheme_of(url))
    if proto is None:
        raise UsageError("target must be " + ", ".join(p.usage for p in protocols())
                         + f", not {url!r}")
    return proto


def compiled_schemes() -> tuple[str, ...]:
    """The schemes the compiled loop speaks (its protocols', TLS ones included)."""
    return tuple(s for p in protocols() if p.compiled for s in p.schemes)


def tls_schemes() -> tuple[str, ...]:
    """The schemes that speak TLS (``https``, ``grpcs``, ``openai+https``...)."""
    return tuple(s for p in protocols() for s, tls in p.schemes.items() if tls)


def kinds_for(scheme: str) -> tuple[str, ...]:
    """The error kinds of the protocol of ``scheme`` (``https``, ``grpcs``, ``openai``...)."""
    proto = registry().get(scheme) or by_kind(scheme)
    return proto.kinds


def flag_protocols() -> dict[str, tuple[str, ...]]:
    """Each request option and the protocols (kinds) that read it."""
    out: dict[str, list[str]] = {}
    for proto in protocols():
        for flag in proto.flags:
            out.setdefault(flag, []).append(proto.kind)
    return {f: tuple(k) for f, k in out.items()}


# LLM options that only one kind of workload reads.
WORKLOAD_FLAGS: dict[str, tuple[str, ...]] = {
    "--input-len": ("fixed", "random", "multiturn"),
    "--output-len": ("fixed", "random", "multiturn"),
    "--range-ratio": ("random",),
    **{f: ("multiturn",) for f in ("--conversations", "--turns", "--system-len")},
    **{f: ("trace",) for f in ("--trace", "--trace-token-scale", "--trace-time-scale")},
}


def refuse_flags(opts: Any, proto: Protocol, defaults: dict[str, Any]) -> None:
    """A request option given (not at its default: ``defaults``, the options' own, by
    name) for a protocol that does not read it is a usage error naming both: nothing is
    silently ignored."""
    for flag, kinds in flag_protocols().items():
        dest = flag[2:].replace("-", "_")
        if proto.kind in kinds:
            continue
        if getattr(opts, dest, defaults.get(dest)) != defaults.get(dest):
            raise UsageError(f"{flag} does not apply to {proto.label}:// targets (it is for "
                             + ", ".join(by_kind(k).label + "://" for k in kinds) + ")")
    if not proto.tokens:
        return
    for flag, kinds in WORKLOAD_FLAGS.items():
        dest = flag[2:].replace("-", "_")
        if opts.workload not in kinds and getattr(opts, dest) != defaults.get(dest):
            raise UsageError(f"{flag} does not apply to --workload {opts.workload} (it is for "
                             f"--workload {' or '.join(kinds)})")
