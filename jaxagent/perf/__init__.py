"""Self-measurement: per-iteration MFU and bandwidth fractions (``roofline.py``) and host
memory returned between phases (``host_memory.py``)."""
