"""Field types shared by the contracts.

- `Int`: pydantic's strict int. A JSON number without a fraction or a Python int; never a
  boolean (`true` is not 1), a string ("2") or a float (2.0). The CLI turns its integer flags
  into numbers before it validates (gpufleet_cli.spec.integer). Decimal fields (money, GPU
  fractions) refuse booleans too: pydantic's Decimal does (tests/unit/test_input_validation.py).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Strict

Int = Annotated[int, Strict()]
