"""Response cache stores: `memory` (in-process, the embedded default) and `redis`."""
