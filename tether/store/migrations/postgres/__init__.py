"""PostgreSQL migrations: NNNN_name.sql, applied in order by `tether.store.postgres`."""
