"""Transports move message slices between ranks; the executor above them owns matching,
ordering and reduction. See ``base.py`` for the seam."""
