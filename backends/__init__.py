"""Talking to the outside world: retrieval, LLM tiers, cache stores and embeddings.

Each backend kind is one small async interface; `routers/` and `gateway/` only see those
interfaces, never a wire protocol (opensearch-py, redis, litellm stay below this package).
"""
