"""The sandbox the code reward runs untrusted Python in.

- `runner.py`: the host side, `Sandbox` (imported from here: `from rlvr.rewards.sandbox import Sandbox`),
  which starts one zygote and hands it each run, and `score_completion`, the reward.
- `zygote.py`: the pre-started interpreter that forks a child per run; with `setup.py` (the
  namespaces, mounts and limits) and `harness.py` (the audit hook and import allowlist in the child).
  Those three are standalone scripts, standard library only, that rlvr never imports: the zygote
  loads the other two by path.

docs/code-reward.md lists the layers, their fallbacks and the limits.
"""

from rlvr.rewards.sandbox.runner import (
    DEFAULT_ALLOWED_IMPORTS,
    Sandbox,
    SandboxError,
    SandboxLimits,
    TestRun,
    extract_code,
    parse_tests,
    score_completion,
)

__all__ = ["DEFAULT_ALLOWED_IMPORTS", "Sandbox", "SandboxError", "SandboxLimits", "TestRun", "extract_code",
           "parse_tests", "score_completion"]
