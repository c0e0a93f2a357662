"""``python -m ddlib.protocols``: write every protocol notebook's parameters cell from its spec
(run it after changing a protocol's parameters; ``tests/test_notebooks.py`` checks they agree). A
protocol of your own (``$DDLIB_PROTOCOL_PATH``) has its notebook written in its own folder."""

from ddlib.protocols.spec import all_specs, notebook_folder, sync_notebook
from ddlib.store.paths import PROJECT_ROOT

for spec in all_specs():
    folder = notebook_folder(spec.name) or PROJECT_ROOT / "notebooks"
    changed = sync_notebook(spec, folder)
    print(f"{folder / spec.notebook}: {'written' if changed else 'already the spec'}")
