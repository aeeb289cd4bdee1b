"""Response stores: the interface (base.py), one module per engine, and a factory (factory.py)."""
