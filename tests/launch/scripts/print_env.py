"""Prints the rank environment hccl-launch sets (one KEY=VALUE line each) and echoes argv.

Run as a script or with ``-m print_env`` (the tests put this folder on PYTHONPATH).
"""

import os
import sys

NAMES = [
    "RANK_ID",
    "RANK_SIZE",
    "DEVICE_ID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "HCCL_PY_STORE_ADDR",
    "HCCL_PY_STORE_PORT",
    "HCCL_PY_JOB_ID",
    "HCCL_PY_STORE_HOSTED",
    "PYTHONUNBUFFERED",
    "PYTHONPATH",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "HCCL_PY_NPU_STRICT",
]

for name in NAMES:
    print(f"{name}={os.environ.get(name, '<unset>')}")
print(f"ARGV={sys.argv[1:]}")
print(f"stderr line of rank {os.environ.get('RANK_ID')}", file=sys.stderr)
