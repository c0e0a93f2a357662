import sys

from ddlib.cli import main

sys.exit(main())
