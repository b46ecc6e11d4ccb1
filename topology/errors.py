"""The one error class of :mod:`topology`.

``topology`` is pure data and never imports ``hccl_py``, so it cannot raise ``HcclParamError``
itself; it raises :class:`TopologyError` (a ``ValueError``) carrying the same code, and the
runtime wraps it. ``field`` names what is wrong so callers and tests can branch on it::

    try:
        RankTable.load("rank_table.json")
    except TopologyError as err:
        print(err.field, err.code)   # e.g. "server_list[1].device[0].rank_id" 1
"""

from __future__ import annotations

HCCL_E_PARA = 1  # HcclResult.E_PARA: every topology problem is a bad parameter


class TopologyError(ValueError):
    """A bad rank table, preset name, figure file or group partition.

    ``field`` is the key or field at fault (``None`` when the problem is not one field, e.g. a
    file that is not JSON); ``code`` is ``HCCL_E_PARA`` (1). The message names the field and the
    fix, in the style of HCCL's own EI0004/EI0014 reports.
    """

    code: int = HCCL_E_PARA

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field

    def __reduce__(self):  # keep field across pickling between processes
        return (type(self), (self.message, self.field))
