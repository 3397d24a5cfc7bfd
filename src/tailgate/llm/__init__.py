"""LLM serving, what is LLM-specific only: workloads, OpenAI chunk semantics and SSE,
token accounting (TTFT/ITL/TPOT/goodput, recorded by the one bench engine), and the pure
arithmetic behind the L4 checks (engine metrics, speculative decoding)."""
