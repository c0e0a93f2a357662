"""What the builtin set-making kinds produce, as a number per kind: :mod:`ddlib.methods.sources`
registers them (part of every cell's config key, so a rerun recomputes cells whose set changed) and
the cache of DM sets keys by them (:mod:`ddlib.methods.dm`), so a set made by older code is never
read. Bump a kind's revision whenever the sets it makes change; a kind absent here is at revision 1.

- kcenter 2: DC-Bench's k-means selection with fp32 features (keys before it were unchanged).
- dm 2: noise starts draw their noise from a generator of their own, so their real batches are those
  of DM from real images (shared, paired); their sets changed. Sets from real or K-Center images are
  as before (their cells are recomputed once: the revision is the kind's).
"""

SET_REVISIONS = {"kcenter": 2, "dm": 2}
