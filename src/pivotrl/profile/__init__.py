"""Profiling (PivotRL step 2): `loop` samples K actions per turn from the reference policy and
scores them; `runs` puts that loop over files (resume, shards, merge, cost accounting)."""
