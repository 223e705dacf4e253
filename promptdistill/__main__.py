import sys

from promptdistill.cli import main

sys.exit(main())
