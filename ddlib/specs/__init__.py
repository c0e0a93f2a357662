"""Specs and parsing, the vocabulary every layer shares: the one ``Registry`` class (``registry``), reuse
keys kept valid as ddlib grows (``keys``), strict YAML (``yamlfile``), units (``units``) and quoted values
in messages (``shown``). Imports nothing of ddlib above it (``keys`` reads protocol revisions lazily)."""
