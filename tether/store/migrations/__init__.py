"""SQL migrations of the store engines, one folder per engine (data files, not modules)."""
