"""Running grids: the grid file (``grid``), the batch runner (``runner``), where cells execute (worker side ``executors``,
local ``pool``, Ray ``cluster``, warm ``kernels``), the dry run (``plan``), a cell's work and time (``work``, ``timing``,
``calibrate``, ``estimate``), the console, the shipped grids. The top layer under the command line: it may import anything."""
