"""`tailgate diagnose`: explain a tail spike from evidence taken over the same window.

The library call (:mod:`.spec`, :mod:`.runner`)::

    from tailgate.diagnose import DiagnoseSpec, run
    doc = run(DiagnoseSpec.of("http://127.0.0.1:8080/", pid=[1234], rate="1k", duration="5s"))
    print(doc["verdict"]["first"])

* :mod:`.spec` — :class:`.spec.DiagnoseOptions` and the load's options checked into a
  :class:`.spec.DiagnoseSpec`;
* :mod:`.runner` — ``run(spec) -> document``: :func:`.runner.collect` gathers the window's
  :class:`.window.Evidence`, :func:`.analyse.analyse` turns it into the document;
* :mod:`.evidence` reads the world during the window (the diagnose probe, counter polls),
  :mod:`.counters` the counters inspect reads, :mod:`.profile` the profile probe;
* :mod:`.attribution` is pure: requests and events on one clock in, ranked causes out;
* :mod:`.accounting` splits each request's latency into parts;
* :mod:`.timeline` bins both on a common time axis for the report.
"""

from typing import Any

_LAZY = {"DiagnoseOptions": ".spec", "DiagnoseSpec": ".spec", "build": ".spec",
         "run": ".runner", "collect": ".runner", "Evidence": ".window"}


def __getattr__(name: str) -> Any:  # the library call, imported when first used
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
