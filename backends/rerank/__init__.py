"""Second-stage rerankers: re-score fused candidates reading query and passage together."""
