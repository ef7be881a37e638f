"""The HTTP surface: protocol, bodies, schemas, wire shapes, streaming, middleware, handlers."""
