"""What the builtin set-making kinds produce, as a number per kind: :mod:`ddlib.methods.sources`
registers them (part of every cell's config key, so a rerun recomputes cells whose set changed) and
the cache of DM sets keys by them (:mod:`ddlib.methods.dm`), so a set made by older code is never
read. Bump a kind's revision whenever the sets it makes change; a kind absent here is at revision 1.

- kcenter 2: DC-Bench's k-means selection with fp32 features (keys before it were unchanged).
- dm 2: noise starts draw their noise from a generator of their own, so their real batches are those
  of DM from real images (shared, paired); their sets changed. Sets from real or K-Center images are
  as before (their cells are recomputed once: the revision is the kind's).
- layout (kcenter 3, dm 3, kcenter_greedy, herding, forgetting, el2n 2): their networks see row-major
  tensors (:mod:`ddlib.data.layout`); on 1-channel data such as digits, whose loader kept stride 1 on the
  channel axis, the convolutions round otherwise and the sets changed (3-channel data: the same sets).
- aum 1, ccs 1 (issue 57.2): the pruning baselines, new (named so that their first change bumps them).
"""

SET_REVISIONS = {"kcenter": 3, "dm": 3, "kcenter_greedy": 2, "herding": 2, "forgetting": 2, "el2n": 2,
                 "aum": 1, "ccs": 1}
