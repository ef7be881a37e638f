"""Deciding how much work a question deserves: classify, apply policy, execute the route."""
