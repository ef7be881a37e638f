"""The request core, free of aiohttp: the request's value objects and scope, the pipeline and
its stages, finishing, routing, runtime and health."""
