"""The request core, free of aiohttp: the pipeline's stages, routing, runtime and health."""
