import sys

from hasten.commands.cli import main

sys.exit(main())
