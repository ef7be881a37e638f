"""The querygate service: HTTP surface, settings, metrics and the request pipeline."""
