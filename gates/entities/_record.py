"""The record base (`Record`) and the JSON numbers records hold (`Real`, `Number`).

The records that `gates verify`, `gates status`, `render_report`, the dashboard and `gates report`
read, and the verdict engine builds: frozen pydantic models, handed out at the store boundary
(`read_evidence`), as MLflow hands out its entities. Extra keys are allowed everywhere and kept (the
verdict engine adds fields; a newer or older writer's keys survive a read and a write); types are
strict (a metric is a JSON number or null, never "0.9" or true; a seed is an integer, never 1.0). A
record remembers the order of the keys it was read from and which keys it had (`has`): `as_dict()`
gives back that JSON, key for key and in that order, so evidence read and written again is the same
bytes.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    PlainSerializer,
    PrivateAttr,
    WrapValidator,
    model_serializer,
    model_validator,
)


class Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, frozen=True)
    _keys: tuple[str, ...] = PrivateAttr(default=())  # the keys as written, in their order

    @model_validator(mode="wrap")
    @classmethod
    def _remember_keys(cls, data, handler):
        record = handler(data)
        if isinstance(data, dict) and record is not data:
            record._keys = tuple(data)
        return record

    @model_serializer(mode="wrap")
    def _in_written_order(self, handler):
        out = handler(self)
        if not isinstance(out, dict) or not self._keys:
            return out
        first = {k: out[k] for k in self._keys if k in out}
        return first | {k: v for k, v in out.items() if k not in first}

    def has(self, name: str) -> bool:
        """Whether the record has this key (written, even as null), as against a default."""
        return name in self.model_fields_set or name in (self.__pydantic_extra__ or {})

    def written(self, name: str, absent=None):
        """A field as its writer wrote it (null included), or `absent` where the record lacks the key
        (for a reader that shows a missing field otherwise than its default)."""
        return getattr(self, name) if self.has(name) else absent

    def revised(self, **changes) -> Self:
        """A copy with these fields changed, checked as a new record; each key keeps its place (a
        new one goes last). Records are frozen: the verdict engine settles a condition in steps
        (families, lost values, stalled arms), each a revised copy."""
        return type(self).model_validate(self.model_dump(exclude_unset=True) | changes)

    def as_dict(self) -> dict:
        """The record as JSON data: the keys it was read or built from, in their order."""
        return self.model_dump(mode="json", exclude_unset=True)

    def __eq__(self, other) -> bool:  # the same fields (defaults included), whatever the key order
        return type(other) is type(self) and self.model_dump() == other.model_dump()

    __hash__ = None  # records hold lists and dicts


def _int_stays_int(value, handler):
    checked = handler(value)  # as a float: a JSON number (an int is fine), never a bool or a string
    return value if type(value) is int else checked


# a JSON number; an int stays an int (1 is read and written back as 1, never 1.0)
Real = Annotated[float, WrapValidator(_int_stays_int), PlainSerializer(lambda x: x)]
Number = Real | None  # null for a value that was not finite
