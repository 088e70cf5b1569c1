"""The record entities: what evidence.json holds (frozen records) and the verdict, in the lowest layer.

As MLflow's `entities`: the shapes that cross every boundary (the verdict engine builds them, the
record writes and reads them, verify, the CLI and the dashboard show them), so every layer above can
use them and none defines its own copy. Nothing here reads or writes a file.

Private modules: `_record` (the base `Record`, with its key-order memory, and the JSON numbers
`Real` and `Number`), `_run` (a run: `RunRecord` and its parts), `_condition` (a condition as
judged: `ConditionRecord`), `_verdict` (what the verdict engine reaches: `Verdict`, and its parts:
`HaltRecord`, `LostValueRecord`, `NotRunRecord`, `BeyondCeilingRecord`, `LookRecord`), `_json`
(`json_safe`: data as JSON can hold it).
"""

from typing import TYPE_CHECKING

from gates._face import lazy_face

# what type checkers and editors resolve; at run time each name loads on first use
if TYPE_CHECKING:
    from gates.entities._condition import ConditionRecord
    from gates.entities._json import json_safe
    from gates.entities._record import Number, Real, Record
    from gates.entities._run import ConvergenceRecord, FirstSignalRecord, RunErrorRecord, RunRecord
    from gates.entities._tuning import BestTrialRecord, TrialRecord, TunedArmRecord, TuningRecord
    from gates.entities._verdict import (
        BeyondCeilingRecord,
        HaltRecord,
        LookRecord,
        LostValueRecord,
        NotRunRecord,
        Verdict,
        as_json,
    )

# public name -> its private module, imported on first use
_FACE = {
    "BeyondCeilingRecord": "_verdict",
    "ConditionRecord": "_condition",
    "ConvergenceRecord": "_run",
    "FirstSignalRecord": "_run",
    "HaltRecord": "_verdict",
    "LookRecord": "_verdict",
    "LostValueRecord": "_verdict",
    "NotRunRecord": "_verdict",
    "Number": "_record",
    "Real": "_record",
    "Record": "_record",
    "RunErrorRecord": "_run",
    "RunRecord": "_run",
    "TrialRecord": "_tuning",
    "TunedArmRecord": "_tuning",
    "TuningRecord": "_tuning",
    "BestTrialRecord": "_tuning",
    "Verdict": "_verdict",
    "as_json": "_verdict",
    "json_safe": "_json",
}
__all__ = sorted(_FACE)
__getattr__, __dir__ = lazy_face(__name__, _FACE)
