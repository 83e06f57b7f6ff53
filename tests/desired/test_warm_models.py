"""Model validators are built on first use; the parse pool's fork server builds them all (`desired.reading.warm`)."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import pydantic
from desired import models
kinds = [v for v in vars(models).values()
         if models.defined_here(v) and issubclass(v, pydantic.BaseModel)]
before = sum(k.__pydantic_complete__ for k in kinds)
{action}
print(len(kinds), before, sum(k.__pydantic_complete__ for k in kinds))
"""


def _probe(action: str) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(action=action)], capture_output=True, text=True, check=True
    )
    return [int(x) for x in done.stdout.split()]


def test_importing_the_models_builds_no_validator_and_warm_builds_every_one() -> None:
    kinds, before, after = _probe("import desired.reading.warm")
    # none is built at import: defaults that are models (`Hugepages.model_construct()`, ...) are
    # made without validation, so a command that validates nothing (a cached PR plan) builds none
    assert kinds > 15 and before == 0 and after == kinds


def test_model_defaults_are_what_validation_gives() -> None:
    """A default made by model_construct equals, field for field, the model validated from the same values."""
    import pydantic

    from desired import models

    checked = 0
    for kind in [v for v in vars(models).values() if models.defined_here(v) and issubclass(v, pydantic.BaseModel)]:
        for name, field in kind.model_fields.items():
            default = field.default
            if isinstance(default, pydantic.BaseModel):
                validated = type(default).model_validate(default.model_dump(exclude_unset=True))
                assert default == validated, (kind.__name__, name)
                assert default.model_fields_set == validated.model_fields_set, (kind.__name__, name)
                checked += 1
    assert checked >= 8


def test_a_model_is_built_on_first_use_without_warm() -> None:
    kinds, before, after = _probe("models.Sku.model_json_schema()")
    assert before < after < kinds
