"""One module per endpoint family: parse, call the core, shape the answer."""
