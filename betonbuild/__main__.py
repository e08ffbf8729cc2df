import sys

from betonbuild.cli import main

sys.exit(main())
