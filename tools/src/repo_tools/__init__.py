"""Workspace tooling: the ``demo`` runner and the ``release`` helper."""
