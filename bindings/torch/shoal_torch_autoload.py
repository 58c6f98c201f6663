"""torch.backends entry point: torch calls load() at the end of `import torch`, so a script
that only says init_process_group("shoal") finds the backend without importing shoal_torch.
A failure here must not break `import torch`: it becomes a warning (and
init_process_group("shoal") then says the backend is unknown)."""


def load():
    try:
        import shoal_torch  # noqa: F401  registers the backend
    except Exception as e:  # pragma: no cover - depends on the installation
        import warnings
        warnings.warn("shoal_torch could not be loaded (%s: %s); the torch.distributed "
                      "backend 'shoal' is not registered" % (type(e).__name__, e))
