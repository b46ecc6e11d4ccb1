"""Modeled time, apart from the data that moves: the cost model (every formula's one home),
the cluster-scale simulator that evaluates schedules with it, and the simulated card each rank
hosts (its clock, HBM and compute). Nothing here moves a byte between processes."""
