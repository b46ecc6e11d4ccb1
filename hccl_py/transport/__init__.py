"""Transports move message slices between ranks; the executor above them owns matching,
ordering and reduction. See ``base.py`` for the seam: ``shm.py`` (one host), ``tcp.py``
(between hosts), ``hosts.py`` (both at once), ``mpi.py`` (under mpiexec/srun); ``choice.py``
decides which a job uses."""
