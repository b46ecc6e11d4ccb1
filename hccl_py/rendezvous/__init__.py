"""How the ranks of a job meet, apart from the transports that then move their bytes: the job's
key-value store (store.py, over pyzmq) and its secret (secret.py), the same calls over torch's
c10d store (torch.py), the check that the ranks met alone (membership.py), and connect.py, which
meets, agrees and hands each rank its transport."""
