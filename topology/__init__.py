"""The cluster as data: rank tables, link and card figures, topologies with routes, presets and
communication-group partitions. Pure: imports only the standard library, numpy and networkx
(matplotlib only inside ``hccl-topo show --png``); never ``hccl_py`` or ``launch``.

>>> from topology import Topology, auto_partition
>>> topo = Topology.preset("ascend910-8p")
>>> topo.route(0, 1).bandwidth_Bps / 2**30, auto_partition(topo)
(10.0, [[0, 1, 2, 3], [4, 5, 6, 7]])
"""

from .errors import TopologyError
from .figures import CARD_MODELS, LINK_KINDS, CardModel, LinkSpec, load_figures
from .groups import auto_partition, load_partition, validate_partition
from .presets import PRESETS, default_preset
from .rank_table import RankInfo, RankTable
from .topology import Route, Topology

__all__ = [
    "CARD_MODELS",
    "LINK_KINDS",
    "PRESETS",
    "CardModel",
    "LinkSpec",
    "RankInfo",
    "RankTable",
    "Route",
    "Topology",
    "TopologyError",
    "auto_partition",
    "default_preset",
    "load_figures",
    "load_partition",
    "validate_partition",
]
