"""ddlib's version: in every run's tags and bundle (``ddlib.__version__`` hands it on)."""

VERSION = "0.2.0"
