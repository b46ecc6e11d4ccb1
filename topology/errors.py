"""The one error class of :mod:`topology`.

``topology`` is pure data and never imports ``hccl_py``, so it cannot raise ``HcclParamError``
itself; it raises :class:`TopologyError` (a ``ValueError``) carrying the same code, and the
runtime wraps it. Fields say what is wrong so callers and tests can branch on them (the names
are ``hccl_py.HcclError``'s)::

    try:
        RankTable.load("rank_table.json")
    except TopologyError as err:
        print(err.field, err.rule, err.value)   # e.g. "server_list[1].device[0].rank_id" "unique" "3"
"""

from __future__ import annotations

from typing import Any

HCCL_E_PARA = 1  # HcclResult.E_PARA: every topology problem is a bad parameter


class ErrorFields:
    """Context carried as fields beside the message: a mixin of :class:`TopologyError` and of
    ``hccl_py.HcclError`` (one home: topology is the lowest layer). Any name given at
    construction reads back as an attribute; a name in the class's ``FIELDS`` that was not given
    reads ``None``; any other name is an AttributeError."""

    FIELDS: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        if name in type(self).FIELDS:
            return None
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")


class TopologyError(ErrorFields, ValueError):
    """A bad rank table, preset name, figure file or group partition.

    ``code`` is ``HCCL_E_PARA`` (1). The message names the field and the fix, in the style of
    HCCL's own EI0004/EI0014 reports. Fields (``None`` when they do not apply):

    - ``field``: the key or field at fault (``"server_list[0].device[1].rank_id"``, ``"groups[2]"``,
      ``"links.PCIE.latency_s"``, ``"n"``, ``"path"``); ``None`` when the problem is not one
      field, e.g. a file that is not JSON;
    - ``value``: the rejected value as given;
    - ``rule``: the check it failed: ``required`` (missing), ``type``, ``format``, ``range``,
      ``choices`` (not one of ``choices``), ``unknown`` (a key that is not allowed), ``const``
      (must equal ``expected``), ``unique`` (``holder`` already has it), ``nonempty``,
      ``complete`` (``missing_ranks`` are in no group), ``consecutive``, ``reference`` (names
      something that does not exist), ``positive``, ``json``, ``file``;
    - ``expected``: what passes (a type or format name, a range such as ``"0..15"``, the value);
    - ``choices``: the accepted values; ``holder``: where a unique value is already used;
    - ``missing_ranks``: ranks that should be present and are not;
    - ``error_id``: HCCL's error id for rank-table problems (``"EI0004"``, ``"EI0014"``);
    - ``path``: the file that could not be read.
    """

    code: int = HCCL_E_PARA
    FIELDS = ("field", "value", "rule", "expected", "choices", "holder", "missing_ranks", "error_id", "path")

    def __init__(self, message: str, field: str | None = None, **fields: Any):
        super().__init__(message)
        self.message = message
        self.fields = {"field": field, **fields}

    def __reduce__(self):  # keep the fields across pickling between processes
        return (_rebuild, (type(self), self.message, self.fields))


def _rebuild(cls: type, message: str, fields: dict) -> TopologyError:
    return cls(message, **fields)
