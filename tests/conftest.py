"""Test configuration. Its presence puts tests/ on sys.path (pytest's prepend import
mode), so every test module, tests/render/ included, can `import builders`."""
