"""Device layout: the mesh and its logical-axis rules (``mesh.py``), the train state's, batch's
and sampler's placement on it (``layout.py``), and multi-host start-up (``distributed.py``)."""
