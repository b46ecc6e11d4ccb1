"""hccl-bench: nccl-tests-style benchmarks of hccl-py, side by side with MPI and torch gloo.

    hccl-bench allreduce -n 2 -b 8 -e 64M -f 2 --vs mpi,gloo

Layout (as nccl-tests): ``harness`` owns sweep, warm-up, timing, checking, repeats and progress;
``collectives/`` says per collective only byte counts, data and the busbw factor; ``peers/``
holds the implementations (hccl-py, mpi4py+MPICH, torch gloo); ``report``/``plot`` render.
"""
