"""TRL's private side that the job's trainer relies on (services/trainer/job/grpo_trainer.py,
TRL_PRIVATE_METHODS and the rest): each still there, as checked. A TRL or transformers that renames
or reshapes one fails here with the seam's name, before a job fails in a way that hides it."""

from __future__ import annotations

import inspect
import warnings

import pytest

from rlvr.services.trainer.job import grpo_trainer as seams


@pytest.fixture(scope="module")
def trl_module():  # noqa: ANN201
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRL's warning about the vLLM release
        import trl
        from trl.trainer import grpo_trainer
    return trl, grpo_trainer


def _versions(trl) -> str:  # noqa: ANN001
    import transformers

    return (f"trl {trl.__version__} and transformers {transformers.__version__} (checked against "
            f"trl {seams.CHECKED_AGAINST['trl']}, transformers {seams.CHECKED_AGAINST['transformers']})")


def test_every_overridden_private_method_is_there_with_its_parameters(trl_module) -> None:  # noqa: ANN001
    trl, module = trl_module
    changed = []
    for name, expected in seams.TRL_PRIVATE_METHODS.items():
        method = getattr(module.GRPOTrainer, name, None)
        if method is None:
            changed.append(f"{name}: gone")
            continue
        parameters = tuple(inspect.signature(method).parameters)
        if parameters[:len(expected)] != expected:
            changed.append(f"{name}{expected} is now {method.__qualname__}{parameters}")
    assert not changed, (f"{_versions(trl)} changed the private methods grpo_trainer.trainer_class overrides or "
                         f"calls: {'; '.join(changed)}. Re-check each override against the new source, then "
                         "TRL_PRIVATE_METHODS and CHECKED_AGAINST in services/trainer/job/grpo_trainer.py")


def test_every_private_attribute_and_batch_key_is_still_trls(trl_module) -> None:  # noqa: ANN001
    trl, module = trl_module
    source = inspect.getsource(module)
    attributes = [a for a in seams.TRL_PRIVATE_ATTRIBUTES if f"self.{a} =" not in source]
    keys = [k for k in seams.TRL_BATCH_KEYS if f'"{k}"' not in source]
    assert not attributes and not keys, (
        f"{_versions(trl)}: GRPOTrainer no longer sets {attributes} or no longer names the batch keys {keys} "
        "that services/trainer/job/grpo_trainer.py reads (TRL_PRIVATE_ATTRIBUTES, TRL_BATCH_KEYS)")


def test_the_table_names_every_private_method_the_subclass_overrides() -> None:
    """The table is complete: each underscore method `trainer_class`'s subclass defines is in it."""
    import ast

    tree = ast.parse(inspect.getsource(seams.trainer_class))
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
               and node.name.startswith("_") and not node.name.startswith("__")}
    assert defined and defined <= set(seams.TRL_PRIVATE_METHODS), defined - set(seams.TRL_PRIVATE_METHODS)
