"""Planning: pure computation that answers sizing questions before hardware is bought.

* :mod:`.kv` — KV-cache bytes per token for MHA/GQA/MQA and DeepSeek MLA, with
  FP8/INT8/INT4 and block scales; what fits an HBM budget.
* :mod:`.specdec` — speculative decoding: Leviathan et al.'s closed forms, the
  method's choice of drafter, an acceptance estimator from logged probabilities.
* :mod:`.fanout` — tail at scale: the maximum of N leaves, sequential hops,
  hedged requests, from measured histograms.
* :mod:`.prefix_cache` — a two-tier radix-tree prefix cache replaying real traces
  (:mod:`.traces` parses Mooncake, token-id and Azure traces into block-hash chains).
* :mod:`.sweep` — ``tailgate bench --sweep``: the highest rate meeting the SLOs
  (``run_sweep(SweepSpec.of(...))``: a bench run per rate).

Each ``plan`` subcommand is a library call: a checked spec (:mod:`.spec`, which reads
the input files through the hardened reader, :mod:`.inputs`) and ``run(spec) -> document``
(:mod:`.runner`)::

    from tailgate.plan import KvSpec, run
    doc = run(KvSpec.of("config.json", dtype="fp8", hbm="141GB", tp=8))

The other modules compute only; the ``plan`` command (``tailgate/commands/plan.py``)
parses, calls and renders (``tailgate/report/plan_render.py``).
"""

from .runner import run
from .spec import FanoutSpec, KvSpec, PrefixCacheSpec, SpecdecSpec

__all__ = ["FanoutSpec", "KvSpec", "PrefixCacheSpec", "SpecdecSpec", "run"]
