"""`json_safe`: data as JSON can hold it, for every writer of JSON records (evidence, `--json`)."""

from __future__ import annotations

import math

import numpy as np


def json_safe(x):
    """NaN and infinities are not JSON; numpy scalars are not JSON-able either."""
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x
