"""The agents rlvr ships (entry points of the group ``rlvr.environments`` in pyproject.toml)."""
