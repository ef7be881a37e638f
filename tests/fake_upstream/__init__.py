"""A fake OpenAI-compatible upstream process for tests; see `tests.fake_upstream.server`."""
