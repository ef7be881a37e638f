"""`querygate eval`: routing and retrieval measured on an operator's labelled questions."""
