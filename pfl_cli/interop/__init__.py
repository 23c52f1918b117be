"""Bridges to other federated-learning tools (optional extras)."""
