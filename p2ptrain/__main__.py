import sys

from p2ptrain.app import main

sys.exit(main())
