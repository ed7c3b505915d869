"""rlvr's own environments, one module each, registered as entry points of ``rlvr.environments``
(pyproject.toml): ``calculator`` (a tool for arithmetic), ``guess_number`` (a game of several
turns, no tools) and ``code_run`` (run a candidate against the visible tests before answering)."""
