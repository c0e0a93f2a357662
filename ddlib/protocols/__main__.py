"""``python -m ddlib.protocols``: write every protocol notebook's parameters cell from its spec
(run it after changing a protocol's parameters; ``tests/test_notebooks.py`` checks they agree)."""

from ddlib.protocols.spec import all_specs, sync_notebook
from ddlib.tracking import PROJECT_ROOT

for spec in all_specs():
    changed = sync_notebook(spec, PROJECT_ROOT / "notebooks")
    print(f"notebooks/{spec.notebook}: {'written' if changed else 'already the spec'}")
