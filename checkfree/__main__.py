import sys

from checkfree.cli import main

sys.exit(main())
