"""Open-loop load generation with coordinated-omission-correct latency (``tailgate bench``).

One engine for every protocol; modules, each usable on its own:

The library call (:mod:`.spec`, :mod:`.runner`)::

    from tailgate.bench import BenchSpec, run
    result = run(BenchSpec.of("http://127.0.0.1:8080/", rate="1k", duration="5s",
                              slo=["p99<5ms"]))
    print(result.json["latency_ms"]["p99"], result.passed)

* :mod:`.spec`     — :class:`.spec.BenchOptions` (as given) checked into a :class:`.spec.BenchSpec`.
* :mod:`.runner`   — ``run(spec) -> BenchResult`` on this host (``tailgate.report.bench_outputs.save``
  writes its outputs).
* :mod:`.protocols` — the protocol registry: each protocol module registers its schemes,
  options, error kinds, target builder and connection.
* :mod:`.units`    — parse "10s", "500ms", "20k", escaped byte strings (pure).
* :mod:`.schedule` — intended send times: constant or Poisson, split over workers (pure).
* :mod:`.target`   — ``http://`` / ``tcp://`` / ``openai+http://`` targets and the request
  bytes (pure).
* :mod:`.slo`      — ``p999<5ms``-style SLO expressions: parse and evaluate (pure).
* :mod:`.outcome`  — outcome codes (ok, connect, timeout, reset, status_4xx, truncated, …).
* :mod:`.http1`    — HTTP/1.1 response framing, sans I/O (RFC 9112; http and openai+).
* :mod:`.timer`    — microsecond-precise wake-ups for the event loop (timerfd).
* :mod:`.conn`     — what every connection shares: send one request, report its end once.
* :mod:`.http`, :mod:`.tcp`, :mod:`.openai_sse` — one connection each, as asyncio protocols
  (tcp holds its sans-I/O framer, :class:`.tcp.TcpReader`; openai_sse streams through
  :mod:`tailgate.llm.sse` and times each token, see :mod:`tailgate.llm.accounting`).
* :mod:`.engine`   — one process: schedule, connection pool, time-outs, recording.
* :mod:`.fastpath` — the same engine with its hot loop compiled (``fastloop.c``) for
  ``http://``, ``tcp://`` and ``openai+http://`` (its JSON read by :mod:`.fast_sse`);
  :func:`.fastpath.choose` picks the engine (``--engine``).
* :mod:`.workers`  — N engine processes, merged exactly.
* :mod:`.result`   — the merged result: JSON, summary, warnings, per-request log.
* :mod:`.progress` — the live display.

Times kept for every request (all CLOCK_MONOTONIC seconds): ``intended`` (the
schedule's), ``send`` (bytes handed to the socket), ``end`` (response complete, error,
or ``intended + timeout`` for a time-out) and, on the compiled engine, ``arrive`` (the
kernel's receive stamp of the reply's last bytes). A reply ends at ``arrive`` where it is
known, else at ``end``: latency is that minus ``intended``, service time that minus
``send``, generator lateness ``dispatch - intended`` where dispatch is when the generator
got to the request, and its read lag ``end - arrive`` (shown apart, in no latency).
"""

from typing import Any

_LAZY = {"BenchOptions": ".spec", "BenchSpec": ".spec", "build": ".spec", "run": ".runner",
         "save": ".runner", "Hooks": ".runner", "BenchResult": ".result"}


def __getattr__(name: str) -> Any:  # the library call, imported when first used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
