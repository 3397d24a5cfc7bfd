"""Planning: pure computation that answers sizing questions before hardware is bought.

* :mod:`.kv` — KV-cache bytes per token for MHA/GQA/MQA and DeepSeek MLA, with
  FP8/INT8/INT4 and block scales; what fits an HBM budget.
* :mod:`.specdec` — speculative decoding: Leviathan et al.'s closed forms, the
  method's choice of drafter, an acceptance estimator from logged probabilities.
* :mod:`.fanout` — tail at scale: the maximum of N leaves, sequential hops,
  hedged requests, from measured histograms.
* :mod:`.prefix_cache` — a two-tier radix-tree prefix cache replaying real traces
  (:mod:`.traces` parses Mooncake, token-id and Azure traces into block-hash chains).
* :mod:`.sweep` — ``tailgate bench --sweep``: the highest rate meeting the SLOs.
* :mod:`.plot` — the curves as self-contained HTML (inline SVG).

No module here does I/O beyond reading the input it is handed; the ``plan``
command (``tailgate/commands/plan.py``) reads files and renders.
"""
