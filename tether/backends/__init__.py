"""Inference backends: one small interface (base.py), one module per adapter, a registry."""
