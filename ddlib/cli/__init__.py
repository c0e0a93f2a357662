"""The command line: ``ddlib run|summary|report|score|runs|export|...`` (``entry``: the parser and
dispatch; ``commands``: the newcomer's commands). The top of the house: it may import everything."""

from ddlib.cli.entry import main

__all__ = ["main"]
