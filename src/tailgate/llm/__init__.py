"""LLM serving: the OpenAI-compatible streaming load test, its workloads, and the
pure arithmetic behind the L4 checks (engine metrics, speculative decoding)."""
