"""The middleware chain, outermost first: request ids and outcomes, then limits."""
