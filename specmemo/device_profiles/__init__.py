"""Device profiles: one TOML file per device (its memory, threads, ISA), validated by schema.py."""
