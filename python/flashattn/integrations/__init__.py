"""Backends for the libraries users already run: `transformers` (attn_implementation="fattn")."""
