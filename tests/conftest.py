from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("ATTUNE_LESSONS", "off")  # tests never write the user's lessons store
