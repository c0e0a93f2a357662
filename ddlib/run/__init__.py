"""Running grids: the batch runner (``runner``), where cells execute (``executors``, warm ``kernels``),
the dry run (``plan``), a cell's work and its estimated time (``work``, ``calibrate``, ``estimate``), the
console and the shipped grids. The top layer under the command line: it may import every package."""
