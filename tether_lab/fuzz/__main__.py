import sys

from tether_lab.fuzz.campaign import main

sys.exit(main())
